// model.cpp: the default training and evaluation steps.
#include "models/model.h"

#include <cmath>
#include <stdexcept>
#include <utility>

#include "engine/context.h"
#include "engine/format.h"
#include "engine/rng.h"
#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/optimizer.h"
#include "ops/view.h"

namespace models {

using engine::Category;
using engine::Phase;

void Model::set_precision(Precision p, bool keep_masters) {
  for (ops::Optimizer* o : optimizers())
    ENGINE_CHECK(o->step_count() == 0, "set_precision: the model has already taken a step");
  precision_ = p;
  engine::set_allow_tf32(p == Precision::tf32);  // process-wide: the last model built decides
  if (compute_dtype() != engine::DType::f32)
    lower_parameters(module(), keep_masters ? optimizers() : std::vector<ops::Optimizer*>{}, compute_dtype());
}

bool TransformerDims::any() const {
  return layers || hidden || heads || ffn || vocab || positions || dropout >= 0 || attention_dropout >= 0;
}

void TransformerDims::apply(const std::string& model, int64_t* layers_, int64_t* hidden_, int64_t* heads_,
                            int64_t* ffn_, int64_t* vocab_, int64_t* positions_, double* dropout_,
                            double* attention_dropout_) const {
  auto set = [](int64_t* dst, int64_t v) {
    if (v) *dst = v;
  };
  set(layers_, layers);
  set(hidden_, hidden);
  set(heads_, heads);
  set(ffn_, ffn);
  set(vocab_, vocab);
  set(positions_, positions);
  if (dropout >= 0) *dropout_ = dropout;
  if (attention_dropout >= 0 && attention_dropout_) *attention_dropout_ = attention_dropout;
  auto origin = [](int64_t given) { return given ? "" : " (the size's)"; };
  const std::pair<const char*, int64_t> dims[] = {{"layers", *layers_}, {"hidden", *hidden_},
                                                  {"heads", *heads_},   {"ffn", *ffn_},
                                                  {"vocab", *vocab_},   {"positions", *positions_}};
  for (const auto& [name, v] : dims)
    ENGINE_CHECK(v > 0 && v <= (int64_t(1) << 24), model, ": --", name, " ", v, " must be 1 to 2^24");
  ENGINE_CHECK(*hidden_ % *heads_ == 0, model, ": hidden ", *hidden_, origin(hidden), " is not divisible by heads ",
               *heads_, origin(heads),
               ": each head gets hidden / heads channels; choose --hidden a multiple of --heads");
  const double p[] = {*dropout_, attention_dropout_ ? *attention_dropout_ : 0.0};
  for (double v : p) ENGINE_CHECK(v >= 0 && v < 1, model, ": a dropout probability of ", v, " is not in [0, 1)");
}

Tensor Model::master_weight(const std::string& name) {
  for (ops::Optimizer* o : optimizers())
    if (o->holds(name)) return o->master_weight(name);
  return Tensor();
}

void Model::use_optimizer(const std::string& name) {
  ENGINE_CHECK(optimizer_->step_count() == 0, "use_optimizer: the model has already taken a step");
  ENGINE_CHECK(optimizers().size() == 1, "--optimizer: this model has ", optimizers().size(),
               " optimizers (one per network); it keeps its recipe's");
  const auto params = module().named_parameters();
  std::unique_ptr<ops::Optimizer> next =
      ops::make_optimizer(name, params, optimizer_->lr(), optimizer_->weight_decay());
  const ops::Optimizer& recipe = *optimizer_;
  next->exclude_from_weight_decay([&](const std::string& p) { return !recipe.decays(p); });
  optimizer_ = std::move(next);
}

bool take_losses(std::map<std::string, Tensor>& parts, StepResult& r) {
  bool meta = false;
  for (auto& [name, t] : parts) {
    meta = t.is_meta();
    r.losses[name] = meta ? 0.0 : t.item();
    t = Tensor();
  }
  parts.clear();
  return !meta;
}

std::string first_non_finite_parameter(const graph::Module& module) {
  graph::NoGrad no_grad;
  auto params = module.named_parameters();
  if (params.empty()) return "";
  std::vector<Tensor> tensors;
  for (const auto& [name, p] : params) tensors.push_back(p);
  const std::vector<double> sums = ops::squared_norms(tensors).to_double();
  for (size_t i = 0; i < params.size(); i++)
    if (!std::isfinite(sums[i])) return params[i].first;
  return "";
}

void Model::set_fixed_batch(Batch batch) {
  ENGINE_CHECK(!batch.empty(), "the fixed batch holds no tensors: give a batch file with the tensors the model's "
               "batches have (see its make_batch)");
  for (const auto& [name, t] : batch)
    ENGINE_CHECK(t.numel() > 0, "the fixed batch's tensor '", name, "' is empty (shape ", engine::shape_str(t.shape()),
                 "): a step needs at least one item");
  fixed_batch_ = std::move(batch);
}

Batch Model::next_batch(int64_t step) { return micro_batch(step, 0); }

Batch Model::make_batch(int64_t step) {
  HostBatch h;
  if (prefetched_.batch && prefetched_.step == step && prefetched_.training == module().training()) {
    h = std::move(prefetched_.batch);
    made_ahead_++;
  }
  prefetched_ = Prefetched{};
  if (!h) h = make_host_batch(step);
  ENGINE_CHECK(h, "this model makes no batches: it overrides neither make_batch nor make_host_batch");
  return h();
}

void Model::prefetch_batch(int64_t step) {
  prefetched_ = Prefetched{};
  if (!prefetch_ || !fixed_batch_.empty()) return;
  try {
    prefetched_ = Prefetched{step, module().training(), make_host_batch(step)};
  } catch (const engine::Error&) {
    prefetched_ = Prefetched{};  // made again when its step asks for it, and reported there
  }
}

void Model::set_accumulation(int64_t k) {
  ENGINE_CHECK(k >= 1 && k <= 4096, "--accumulate ", k,
               ": expected 1 (no accumulation) to 4096 micro-batches per step");
  ENGINE_CHECK(k == 1 || supports_accumulation(),
               "--accumulate: this model's step is not one forward and backward "
               "pass (it runs several tasks of its own per step); it cannot accumulate micro-batches");
  accumulate_ = k;
}

Batch Model::micro_batch(int64_t step, int64_t j) {
  const int world = world_size();
  const int64_t parts = this->parts(), part = rank() * accumulate_ + j;
  if (fixed_batch_.empty()) return make_batch(data_step(step, j));
  if (parts == 1) return fixed_batch_;
  Batch micro;
  for (const auto& [name, t] : fixed_batch_) {
    const int64_t rows = t.dim() > 0 ? t.size(0) : 0;
    ENGINE_CHECK(rows % parts == 0 && rows > 0, "the fixed batch's tensor '", name, "' has ", rows,
                 " rows, which do not split into ", parts,
                 world > 1 ? engine::str(" equal parts (", world, " ranks x ", accumulate_, " micro-batches)")
                           : std::string(" equal micro-batches"),
                 "; give a batch whose size is a multiple of --accumulate", world > 1 ? " x the world size" : "");
    const int64_t n = rows / parts;
    micro[name] = ops::contiguous(ops::slice(t, 0, part * n, (part + 1) * n));
  }
  return micro;
}

void Model::set_data_parallel(std::shared_ptr<engine::dist::Communicator> comm, size_t bucket_bytes, int zero_stage,
                              bool bucket_view) {
  ENGINE_CHECK(comm, "set_data_parallel: no communicator");
  ENGINE_CHECK(!comm_, "set_data_parallel: already set");
  // A world of one through a real backend (nccl, gloo) or meta runs the whole data-parallel path (buckets, staging):
  // the tests check it on one GPU; only `single` is the plain process.
  if (std::string(comm->backend()) == "single") return;
  const std::string why = why_not_data_parallel();
  ENGINE_CHECK(why.empty(), "this model cannot train data parallel yet: ", why, "; run it with one rank");
  comm_ = std::move(comm);
  zero_stage_ = zero_stage;
  const auto params = module().named_parameters();
  graph::broadcast_parameters(*comm_, params);
  for (ops::Optimizer* o : optimizers()) {
    ops::NamedTensors mine, masters;
    for (const auto& [name, p] : params) {
      if (!o->holds(name)) continue;
      mine.push_back({name, p});
      if (Tensor m = o->master_weight(name); m.defined()) masters.push_back({name, m});
    }
    graph::broadcast_parameters(*comm_, masters);
    auto reducer = std::make_unique<graph::GradientReducer>(comm_, mine, bucket_bytes, zero_stage, bucket_view);
    if (bucket_view) o->set_after_zero_grad([r = reducer.get()] { r->bind_views(); });
    if (zero_stage >= 1) o->shard([&](const std::string& name) { return reducer->range_of(name); });
    reducers_.emplace_back(o, std::move(reducer));
  }
  if (zero_stage >= 3) {
    ENGINE_CHECK(reducers_.size() == 1, "--zero 3 shards the parameters of a model of one optimizer; this one has ",
                 reducers_.size(), " (one per network: a GAN): use --zero 2");
    graph::GradientReducer& reducer = *reducers_.front().second;
    shards_ = std::make_unique<graph::ParameterShards>(comm_, reducer, module());
    reducer.set_parameter_shards(shards_.get());
    ops::Optimizer* o = optimizers().front();
    o->store_pieces_in([&](const std::string& name) { return shards_->stored(name); });
  }
  // Rank r's own random stream (dropout masks, noise): a distinct Philox key per rank; rank 0 keeps the seed.
  engine::generator().seed += uint64_t(rank()) * 0x9E3779B97F4A7C15ull;
}

graph::GradientReducer* Model::reducer_for(const ops::Optimizer& opt) const {
  for (const auto& [o, reducer] : reducers_)
    if (o == &opt) return reducer.get();
  return nullptr;
}

void Model::backward_for(const ops::Optimizer& opt, const std::function<void()>& backward) {
  if (graph::GradientReducer* r = reducer_for(opt))
    r->reduce_during(backward);
  else
    backward();
}

void Model::after_update(const ops::Optimizer& opt) {
  if (graph::GradientReducer* r = reducer_for(opt)) r->broadcast_updated();
}

double Model::grad_norm(const ops::Optimizer& opt, const std::vector<Tensor>& params) const {
  graph::GradientReducer* r = reducer_for(opt);
  return r && zero_stage_ >= 2 ? r->global_grad_norm() : ops::grad_norm(params);
}

ops::OptimizerState Model::checkpoint_state(ops::Optimizer& opt) const {
  if (!comm_ || zero_stage_ == 0) return opt.state();
  return opt.full_state([&](const Tensor& t) { comm_->all_reduce_sum(t); },
                        [&](std::vector<double>& v) { comm_->all_reduce_host(v); });
}

void Model::average_over_ranks(StepResult& r) const {
  if (!comm_) return;
  std::vector<double> v = {r.loss, double(r.items)};
  for (const auto& [name, x] : r.losses) v.push_back(x);
  comm_->all_reduce_host(v);
  r.loss = v[0] / world_size();
  r.items = int64_t(v[1] + 0.5);
  size_t k = 2;
  for (auto& [name, x] : r.losses) x = v[k++] / world_size();
}

std::vector<double> Model::gather_over_ranks(const std::vector<double>& mine) const {
  const int W = world_size();
  std::vector<double> all(mine.size() * size_t(W), 0.0);
  if (!comm_ || std::string(comm_->backend()) == "meta") {
    for (int r = 0; r < W; r++) std::copy(mine.begin(), mine.end(), all.begin() + r * std::ptrdiff_t(mine.size()));
    return all;
  }
  std::copy(mine.begin(), mine.end(), all.begin() + rank() * std::ptrdiff_t(mine.size()));
  comm_->all_reduce_host(all);  // zeros elsewhere: the sum is every rank's own
  return all;
}

engine::dist::CommTotals Model::communication() const { return comm_ ? comm_->totals() : engine::dist::CommTotals{}; }

std::vector<const graph::GradientReducer*> Model::reducers() const {
  std::vector<const graph::GradientReducer*> out;
  for (const auto& [o, reducer] : reducers_) out.push_back(reducer.get());
  return out;
}

Batch Model::input_batch(int64_t step, int64_t micro) {
  engine::CategoryScope input(Category::input);
  engine::MemoryScope owner("batch");
  return micro >= 0 ? micro_batch(step, micro) : next_batch(step);
}

Tensor Model::batch_loss(const Batch& batch) {
  if (fixed_batch_.empty()) return loss(batch);
  try {
    return loss(batch);
  } catch (const std::out_of_range&) {  // std::map::at: the model read a name the batch file lacks
    std::string names;
    for (const auto& [name, t] : batch)
      names += (names.empty() ? "" : ", ") + name + " " + engine::shape_str(t.shape());
    throw engine::Error(engine::str("the fixed batch lacks a tensor the model reads; it holds: ", names,
                                    ". Write the names and shapes the model's own batches have (see its make_batch)"));
  }
}

StepResult Model::train_step(int64_t step) {
  module().train();
  StepResult r;
  if (comm_)
    if (auto trained = world_trains(step)) {
      ENGINE_CHECK(!shards_,
                   "--zero 3: this model's ranks train different modules in one step (each its own task), "
                   "so they would gather different parameters; use --zero 2");
      for (auto& [o, reducer] : reducers_) reducer->set_uneven(trained);
    }
  const bool scaled = precision_ == Precision::fp16;
  // The sum of the micro-batches' losses, read after the update (no sync before it); one scalar, so that the memory
  // of a step does not depend on the number of micro-batches beyond two.
  Tensor loss_sum;
  for (int64_t j = 0; j < accumulate_; j++) {
    Tensor l;
    {
      engine::PhaseScope phase(Phase::forward);
      if (shards_) shards_->gather_root();  // (a micro-batch's backward released it)
      Batch batch = input_batch(step, j);
      l = batch_loss(batch);
      r.items += items(batch);
    }
    // fp16: backward from loss x scale, so that small gradients stay above f16's smallest normal. Accumulation:
    // from loss / k, so that the summed gradients are those of the mean over the k micro-batches.
    const double factor = (scaled ? loss_scaler_.scale : 1.0) / double(accumulate_);
    auto backward = [&] { graph::backward(factor != 1 ? ops::mul(l, factor) : l); };
    if (j == accumulate_ - 1)
      backward_for(*optimizer_, backward);
    else if (shards_)
      shards_->release_during(backward);
    else
      backward();
    if (!loss_sum.defined()) {
      loss_sum = l;
    } else {
      graph::NoGrad no_grad;
      loss_sum = ops::add(loss_sum, l);
    }
  }
  {
    engine::PhaseScope phase(Phase::optimizer);
    // Clipping and fp16 unscaling are folded into the update: one norm pass over the gradients, then the
    // optimizer multiplies each gradient by (1 / scale) x (the clip coefficient) inside its fused kernel,
    // instead of a scaling pass per gradient (torch.nn.utils.clip_grad_norm_'s g *= max_norm / (norm + 1e-6)).
    bool apply = true;
    double grad_scale = 1;
    // Without fp16's overflow test nothing on the host needs the norm: the clip coefficient is computed on the
    // device and the update reads it there, so the step does not wait for the GPU before its update (ZeRO-2 sums
    // its shards' squares over the world on the host; Adafactor's update takes host scalars).
    Tensor clip_by;
    if (!scaled && clip_norm_ > 0 && zero_stage_ < 2 && optimizer_->reads_device_scale()) {
      clip_by = ops::clip_coefficient(module().parameters(), clip_norm_);
    } else if (scaled || clip_norm_ > 0) {
      const double unscale = scaled ? 1.0 / loss_scaler_.scale : 1.0;
      const double norm = grad_norm(*optimizer_, module().parameters()) * unscale;
      grad_scale = unscale;
      if (clip_norm_ > 0 && norm > clip_norm_) grad_scale *= clip_norm_ / (norm + 1e-6);
      if (scaled) {
        const double scale = loss_scaler_.scale;
        apply = loss_scaler_.update(std::isfinite(norm));
        if (!apply)
          r.details.push_back(engine::str("fp16: gradients overflowed at loss scale ", scale,
                                          ": update skipped, scale now ", loss_scaler_.scale));
      }
    }
    if (apply) {
      optimizer_->set_grad_scale(grad_scale, clip_by);
      if (schedule_) optimizer_->set_lr(schedule_->lr(optimizer_->step_count()));
      optimizer_->step();
      after_update(*optimizer_);
      optimizer_->set_grad_scale(1);
      clip_by = Tensor();
    } else {
      optimizer_->allocate_state();  // the layout as if the update had run (see Optimizer::allocate_state)
    }
    optimizer_->zero_grad();
  }
  prefetch_batch(data_step(step + 1));  // while the GPU runs this step: the wait for the loss comes next
  r.loss = loss_sum.item() / double(accumulate_);
  r.losses["loss"] = r.loss;
  return r;
}

bool Model::update_network(ops::Optimizer& opt, const graph::Module& net, const Tensor& loss, const std::string& name,
                           StepResult& r) {
  const bool scaled = precision_ == Precision::fp16;
  const double scale = loss_scaler_.scale;
  opt.zero_grad();
  {
    engine::MemoryScope s("update_" + name);  // the gradient sums of this backward
    backward_for(opt, [&] { graph::backward(scaled ? ops::mul(loss, scale) : loss); });
  }
  engine::PhaseScope phase(Phase::optimizer);
  bool finite = true;
  if (scaled) {
    finite = std::isfinite(grad_norm(opt, net.parameters()) / scale);
    opt.set_grad_scale(1.0 / scale);
  }
  if (finite) {
    if (schedule_ && &opt == optimizer_.get()) opt.set_lr(schedule_->lr(opt.step_count()));
    opt.step();
    after_update(opt);
  } else {
    opt.allocate_state();  // the layout as if the update had run (Optimizer::allocate_state)
    r.details.push_back(
        engine::str("fp16: ", name, "'s gradients overflowed at loss scale ", scale, ": its update skipped"));
  }
  opt.zero_grad();
  return finite;
}

StepResult Model::eval_step(int64_t step) {
  module().eval();
  graph::NoGrad ng;
  engine::PhaseScope phase(Phase::forward);
  if (shards_) shards_->gather_root();
  Batch batch = input_batch(step);
  StepResult r;
  r.loss = batch_loss(batch).item();
  r.losses["loss"] = r.loss;
  r.items = items(batch);
  if (shards_) shards_->release_all();
  return r;
}

void Model::with_whole_parameters(const std::function<void()>& fn) {
  if (!shards_) return fn();
  shards_->gather_all();
  try {
    fn();
  } catch (...) {
    shards_->release_all();
    throw;
  }
  shards_->release_all();
}

}  // namespace models
