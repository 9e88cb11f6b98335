// optimizer.cpp: the optimizer bookkeeping: lazy state, step counts, master weights, checkpoints.
#include "ops/optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/op.h"
#include "ops/view.h"

namespace ops {

// ---------------------------------------------------------------------------------------------------
// Optimizer

Optimizer::Optimizer(const char* name, const NamedTensors& params, double lr, double weight_decay,
                     std::vector<std::string> slot_names, std::vector<double> slot_initial_values)
    : name_(name),
      slot_names_(std::move(slot_names)),
      slot_initial_values_(std::move(slot_initial_values)),
      lr_(lr),
      weight_decay_(weight_decay) {
  std::set<std::string> seen;
  for (const auto& [n, p] : params) {
    ENGINE_CHECK(p.defined(), name_, ": parameter '", n, "' is undefined");
    ENGINE_CHECK(engine::is_floating(p.dtype()), name_, ": parameter '", n, "' has dtype ",
                 engine::dtype_name(p.dtype()), "; only floating tensors can be optimized");
    ENGINE_CHECK(seen.insert(n).second, name_, ": parameter name '", n, "' appears twice");
    Entry e;
    e.name = n;
    e.param = p;
    entries_.push_back(std::move(e));
  }
}

void Optimizer::set_master_weight(const std::string& name, const Tensor& master) {
  for (Entry& e : entries_) {
    if (e.name != name) continue;
    ENGINE_CHECK(!e.has_state, name_, ": set_master_weight('", name, "') after the parameter's first step");
    ENGINE_CHECK(master.shape() == e.param.shape() && master.dtype() == DType::f32 &&
                     master.device_ptr() == e.param.device_ptr(),
                 name_, ": the master weight of '", name, "' must be f32 ", engine::shape_str(e.param.shape()),
                 " on the parameter's device");
    set_master_weight_unchecked(e, master);
    return;
  }
  throw engine::Error(str(name_, ": set_master_weight: no parameter named '", name, "'"));
}

void Optimizer::set_master_weight_unchecked(Entry& e, const Tensor& master) {
  master.set_category(engine::Category::optimizer);
  master.storage()->set_owner(e.name + "/master");
  e.master = master;
}

Tensor Optimizer::master_weight(const std::string& name) const {
  for (const Entry& e : entries_)
    if (e.name == name) return e.master;
  return Tensor();
}

bool Optimizer::holds(const std::string& name) const {
  for (const Entry& e : entries_)
    if (e.name == name) return true;
  return false;
}

bool Optimizer::decays(const std::string& name) const {
  for (const Entry& e : entries_)
    if (e.name == name) return e.decay;
  throw engine::Error(str(name_, ": decays: no parameter named '", name, "'"));
}

std::vector<Slot> Optimizer::slots_for(const engine::Shape& shape) const {
  std::vector<Slot> slots;
  for (size_t k = 0; k < slot_names_.size(); k++) slots.push_back(Slot{slot_names_[k], shape, slot_initial_values_[k]});
  return slots;
}

void Optimizer::exclude_from_weight_decay(const std::function<bool(const std::string&)>& excluded) {
  for (Entry& e : entries_) e.decay = !excluded(e.name);
}

// The slots of one parameter: tagged `optimizer`, owned by "<param name>/<optimizer>", in phase optimizer.
void Optimizer::allocate_slots(Entry& e) const {
  engine::CategoryScope category(engine::Category::optimizer);
  engine::PhaseScope phase(engine::Phase::optimizer);
  engine::MemoryScope owner(e.name);
  OpScope op(name_);
  e.slots.clear();
  for (const Slot& slot : slots_for(e.state_shape()))
    e.slots.push_back(
        full(slot.shape, slot.initial, e.master.defined() ? e.master.dtype() : e.param.dtype(), e.param.device_ptr()));
  e.has_state = true;
}

void Optimizer::set_grad_scale(double scale, const Tensor& scale_by) {
  ENGINE_CHECK(!scale_by.defined() || reads_device_scale(), name_, ": its update cannot read a factor on the device");
  ENGINE_CHECK(!scale_by.defined() || (scale == 1 && scale_by.dtype() == engine::DType::f64 && scale_by.numel() == 1),
               "set_grad_scale: a device factor is one f64 element, with scale 1");
  grad_scale_ = scale;
  grad_scale_by_ = scale_by;
}

void Optimizer::step() {
  graph::NoGrad no_grad;
  engine::PhaseScope phase(engine::Phase::optimizer);
  // Parameters grouped by their hyperparameters (weight decay, step count), in order of first appearance; each
  // group is one update op. A gradient that is not contiguous is copied and that parameter updated at once, so
  // the copy is freed before the next parameter's slots are allocated: the arena's layout is the same as with
  // one update per parameter.
  struct Group {
    double weight_decay;
    int64_t steps;
    ParamUpdates updates;
  };
  std::vector<Group> groups;
  for (Entry& e : entries_) {
    Tensor g = e.param.grad();
    if (!g.defined() || !e.owned) continue;
    if (!e.has_state) allocate_slots(e);
    e.steps++;
    const double weight_decay = e.decay ? weight_decay_ : 0.0;
    if (!g.is_contiguous()) {
      engine::MemoryScope owner(e.name);
      update({ParamUpdate{e.target(), e.piece(contiguous(g)), e.slots, e.master, grad_scale_, grad_scale_by_}},
             weight_decay, e.steps);
      continue;
    }
    g = e.piece(g);
    auto group = std::find_if(groups.begin(), groups.end(),
                              [&](const Group& gr) { return gr.weight_decay == weight_decay && gr.steps == e.steps; });
    if (group == groups.end()) group = groups.insert(groups.end(), Group{weight_decay, e.steps, {}});
    group->updates.push_back(ParamUpdate{e.target(), g, e.slots, e.master, grad_scale_, grad_scale_by_});
  }
  for (const Group& group : groups) update(group.updates, group.weight_decay, group.steps);
  step_count_++;
}

void Optimizer::allocate_state() {
  graph::NoGrad no_grad;
  for (Entry& e : entries_)
    if (e.param.grad().defined() && e.owned && !e.has_state) allocate_slots(e);
}

Tensor Optimizer::Entry::piece(const Tensor& t) const { return end < 0 ? t : slice(flatten(t), 0, begin, end); }

engine::Shape Optimizer::Entry::state_shape() const { return end < 0 ? param.shape() : engine::Shape{end - begin}; }

void Optimizer::shard(const std::function<std::pair<int64_t, int64_t>(const std::string&)>& range) {
  ENGINE_CHECK(std::string(name_) != "adafactor",
               "ZeRO: adafactor's factored state needs whole matrices, which "
               "ZeRO's pieces of parameters are not; use --zero 0 or another optimizer");
  graph::NoGrad no_grad;
  for (Entry& e : entries_) {
    const auto [begin, end] = range(e.name);
    if (begin < 0) continue;  // not one of the shards' parameters: updated whole
    ENGINE_CHECK(e.owned && e.end < 0, "shard: ", e.name, " is sharded already");
    ENGINE_CHECK(begin >= 0 && begin <= end && end <= e.param.numel(), "shard: ", e.name, " has ", e.param.numel(),
                 " elements, not a piece [", begin, ", ", end, ")");
    if (begin == end) {
      e.owned = false;
      e.master = Tensor();  // its memory goes back to the arena
      e.slots.clear();
      e.has_state = false;
      continue;
    }
    if (begin == 0 && end == e.param.numel()) continue;
    e.begin = begin;
    e.end = end;
    // Each piece a block of its own (a clone, not a view), so that the whole is freed.
    engine::CategoryScope category(engine::Category::optimizer);
    if (e.master.defined()) set_master_weight_unchecked(e, clone(slice(flatten(e.master), 0, begin, end)));
    for (Tensor& s : e.slots) {
      s = clone(slice(flatten(s), 0, begin, end));
      s.storage()->set_owner(e.name + "/" + name_);
    }
  }
}

void Optimizer::store_pieces_in(const std::function<Tensor(const std::string&)>& stored) {
  for (Entry& e : entries_) {
    if (!e.owned) continue;
    Tensor t = stored(e.name);
    if (!t.defined()) continue;
    ENGINE_CHECK(t.shape() == e.state_shape() && t.dtype() == e.param.dtype(), name_, ": store_pieces_in('", e.name,
                 "'): ", engine::shape_str(t.shape()), " is not the shape of its piece ",
                 engine::shape_str(e.state_shape()));
    e.stored = t;
  }
}

std::vector<std::string> Optimizer::params_without_state() const {
  std::vector<std::string> names;
  for (const Entry& e : entries_)
    if (e.param.requires_grad() && e.owned && !e.has_state) names.push_back(e.name);
  return names;
}

void Optimizer::zero_grad() {
  for (Entry& e : entries_) e.param.set_grad(Tensor());
  if (after_zero_grad_) after_zero_grad_();
}

OptimizerState Optimizer::state() const {
  OptimizerState s;
  s.metadata["optimizer"] = name_;
  s.metadata["optimizer.step"] = std::to_string(step_count_);
  for (const Entry& e : entries_) {
    if (!e.owned) continue;
    if (e.master.defined()) s.tensors.emplace_back(e.name + ".master", e.master);  // from the start
    if (e.steps == 0) continue;
    s.metadata["optimizer.step." + e.name] = std::to_string(e.steps);
    const std::vector<Slot> slots = slots_for(e.param.shape());
    for (size_t k = 0; k < e.slots.size(); k++) s.tensors.emplace_back(e.name + "." + slots[k].name, e.slots[k]);
  }
  return s;
}

OptimizerState Optimizer::full_state(const std::function<void(const Tensor&)>& assemble,
                                     const std::function<void(std::vector<double>&)>& assemble_counts) const {
  const bool sharded =
      std::any_of(entries_.begin(), entries_.end(), [](const Entry& e) { return !e.owned || e.end >= 0; });
  // Every rank takes part in the same collectives whether or not its own entries are sharded.
  std::vector<double> flags = {sharded ? 1.0 : 0.0};
  assemble_counts(flags);
  if (flags[0] == 0) return state();
  graph::NoGrad no_grad;
  // Step counts: each piece's owner has the parameter's count (the owners of one parameter agree); others 0.
  std::vector<double> steps, owners;
  for (const Entry& e : entries_) steps.push_back(e.owned ? double(e.steps) : 0), owners.push_back(e.owned ? 1 : 0);
  assemble_counts(steps);
  assemble_counts(owners);
  OptimizerState s;
  s.metadata["optimizer"] = name_;
  s.metadata["optimizer.step"] = std::to_string(step_count_);
  auto whole = [&](const Entry& e, const Tensor& mine, DType dtype) {
    Tensor t = zeros(e.param.shape(), dtype, e.param.device_ptr());
    if (e.owned && mine.defined()) copy_(e.piece(t), mine);
    assemble(t);
    return t;
  };
  for (size_t i = 0; i < entries_.size(); i++) {
    const Entry& e = entries_[i];
    // A lowered parameter (bf16/f16) has an f32 master on its owners: assembled as such.
    const bool has_master = e.param.dtype() != DType::f32 && engine::is_floating(e.param.dtype());
    if (has_master) s.tensors.emplace_back(e.name + ".master", whole(e, e.master, DType::f32));
    const int64_t n = owners[i] > 0 ? int64_t(steps[i] / owners[i] + 0.5) : 0;
    if (n == 0) continue;
    s.metadata["optimizer.step." + e.name] = std::to_string(n);
    const std::vector<Slot> slots = slots_for(e.param.shape());
    for (size_t k = 0; k < slots.size(); k++)
      s.tensors.emplace_back(e.name + "." + slots[k].name, whole(e, k < e.slots.size() ? e.slots[k] : Tensor(),
                                                                 has_master ? DType::f32 : e.param.dtype()));
  }
  return s;
}

namespace {
int64_t parse_count(const std::string& key, const std::string& text) {
  size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  ENGINE_CHECK(used == text.size() && !text.empty() && v >= 0, "optimizer state: metadata '", key, "' = '", text,
               "' is not a non-negative integer");
  return v;
}
}  // namespace

void Optimizer::load_state(const std::map<std::string, Tensor>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  auto get = [&](const std::string& key) -> const std::string* {
    auto it = metadata.find(key);
    return it == metadata.end() ? nullptr : &it->second;
  };
  const std::string* saved_name = get("optimizer");
  ENGINE_CHECK(saved_name, name_, ": load_state: the metadata has no 'optimizer' entry (not an optimizer state?)");
  ENGINE_CHECK(*saved_name == name_, name_, ": load_state: the state was saved by optimizer '", *saved_name, "'");
  const std::string* step = get("optimizer.step");
  ENGINE_CHECK(step, name_, ": load_state: the metadata has no 'optimizer.step' entry");
  // Check everything before changing anything, so a failed load leaves the optimizer as it was.
  std::vector<int64_t> steps(entries_.size(), 0);
  std::vector<std::vector<Tensor>> slots(entries_.size());
  std::vector<Tensor> masters(entries_.size());
  for (size_t i = 0; i < entries_.size(); i++) {
    const Entry& e = entries_[i];
    const DType state_dtype = e.master.defined() ? DType::f32 : e.param.dtype();
    auto master = tensors.find(e.name + ".master");
    if (e.master.defined()) {
      ENGINE_CHECK(master != tensors.end(), name_, ": load_state: '", e.name,
                   ".master' is missing: this run keeps "
                   "f32 master weights (mixed precision) but the state was saved without them (resume with the "
                   "--precision it was saved with)");
      ENGINE_CHECK(master->second.shape() == e.param.shape() && master->second.dtype() == DType::f32 &&
                       master->second.device_ptr() == e.param.device_ptr() && master->second.is_contiguous(),
                   name_, ": load_state: '", e.name, ".master' must be a contiguous f32 ",
                   engine::shape_str(e.param.shape()), " on the parameter's device");
      masters[i] = master->second;
    } else {
      ENGINE_CHECK(master == tensors.end(), name_, ": load_state: the state has a master weight '", e.name,
                   ".master' but this run has none (resume with the --precision it was saved with)");
    }
    if (const std::string* s = get("optimizer.step." + e.name)) steps[i] = parse_count("optimizer.step." + e.name, *s);
    for (const Slot& slot : slots_for(e.param.shape())) {
      std::string key = e.name + "." + slot.name;
      auto it = tensors.find(key);
      if (steps[i] == 0) {
        ENGINE_CHECK(it == tensors.end(), name_, ": load_state: '", key, "' is present but parameter '", e.name,
                     "' has no step count in the metadata");
        continue;
      }
      ENGINE_CHECK(it != tensors.end(), name_, ": load_state: missing state tensor '", key, "'");
      const Tensor& t = it->second;
      ENGINE_CHECK(t.shape() == slot.shape && t.dtype() == state_dtype, name_, ": load_state: '", key, "' is ",
                   engine::dtype_name(t.dtype()), " ", engine::shape_str(t.shape()), ", expected ",
                   engine::dtype_name(state_dtype), " ", engine::shape_str(slot.shape));
      ENGINE_CHECK(t.device_ptr() == e.param.device_ptr(), name_, ": load_state: '", key, "' is on device ",
                   t.device().name(), ", not on the parameter's device (load the file onto that device)");
      ENGINE_CHECK(t.is_contiguous(), name_, ": load_state: '", key, "' is not contiguous");
      slots[i].push_back(t);
    }
  }
  for (size_t i = 0; i < entries_.size(); i++) {
    entries_[i].steps = steps[i];
    entries_[i].slots = slots[i];
    entries_[i].has_state = steps[i] > 0;
    if (masters[i].defined()) set_master_weight_unchecked(entries_[i], masters[i]);
    for (const Tensor& t : slots[i]) {  // tagged as if allocated by the first step
      t.set_category(engine::Category::optimizer);
      t.storage()->set_owner(entries_[i].name + "/" + name_);
    }
  }
  step_count_ = parse_count("optimizer.step", *step);
}

// ---------------------------------------------------------------------------------------------------
// The optimizers

namespace {
std::vector<std::string> sgd_slots(const SgdOptions& o) {
  return o.momentum != 0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
}
std::vector<std::string> rmsprop_slots(const RmsPropOptions& o) {
  std::vector<std::string> s = {"square_avg"};
  if (o.momentum != 0) s.push_back("momentum_buffer");
  if (o.centered) s.push_back("grad_avg");
  return s;
}
void check_options(const char* name, double lr, double weight_decay, double eps) {
  ENGINE_CHECK(lr >= 0, name, ": learning rate must be >= 0, got ", lr);
  ENGINE_CHECK(weight_decay >= 0, name, ": weight_decay must be >= 0, got ", weight_decay);
  ENGINE_CHECK(eps >= 0, name, ": eps must be >= 0, got ", eps);
}
void check_beta(const char* name, const char* which, double beta) {
  ENGINE_CHECK(beta >= 0 && beta < 1, name, ": ", which, " must be in [0, 1), got ", beta);
}
}  // namespace

Sgd::Sgd(const NamedTensors& params, const SgdOptions& o)
    : Optimizer("sgd", params, o.lr, o.weight_decay, sgd_slots(o), std::vector<double>(sgd_slots(o).size(), 0.0)),
      o_(o) {
  check_options("sgd", o.lr, o.weight_decay, 0);
  ENGINE_CHECK(o.momentum >= 0, "sgd: momentum must be >= 0, got ", o.momentum);
  ENGINE_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
               "sgd: nesterov needs momentum > 0 and dampening 0 (as in PyTorch)");
}

void Sgd::update(const ParamUpdates& ts, double weight_decay, int64_t step) {
  sgd_update(ts, SgdStep{lr(), o_.momentum, o_.dampening, weight_decay, o_.nesterov, step == 1});
}

Adam::Adam(const NamedTensors& params, const AdamOptions& o) : Adam("adam", params, o, false) {}

Adam::Adam(const char* name, const NamedTensors& params, const AdamOptions& o, bool decoupled)
    : Optimizer(name, params, o.lr, o.weight_decay, {"exp_avg", "exp_avg_sq"}, {0.0, 0.0}),
      o_(o),
      decoupled_(decoupled) {
  check_options(name, o.lr, o.weight_decay, o.eps);
  check_beta(name, "beta1", o.beta1);
  check_beta(name, "beta2", o.beta2);
}

void Adam::update(const ParamUpdates& ts, double weight_decay, int64_t step) {
  adam_update(ts, AdamStep{lr(), o_.beta1, o_.beta2, o_.eps, weight_decay, decoupled_, step});
}

AdamW::AdamW(const NamedTensors& params, const AdamOptions& o) : Adam("adamw", params, o, true) {}

Adamax::Adamax(const NamedTensors& params, const AdamaxOptions& o)
    : Optimizer("adamax", params, o.lr, o.weight_decay, {"exp_avg", "exp_inf"}, {0.0, 0.0}), o_(o) {
  check_options("adamax", o.lr, o.weight_decay, o.eps);
  check_beta("adamax", "beta1", o.beta1);
  check_beta("adamax", "beta2", o.beta2);
}

void Adamax::update(const ParamUpdates& ts, double weight_decay, int64_t step) {
  adamax_update(ts, AdamaxStep{lr(), o_.beta1, o_.beta2, o_.eps, weight_decay, step});
}

RmsProp::RmsProp(const NamedTensors& params, const RmsPropOptions& o)
    : Optimizer(o.tf_style ? "rmsprop_tf" : "rmsprop", params, o.lr, o.weight_decay, rmsprop_slots(o),
                [&] {
                  // TF starts its mean square at 1 (tf.train.RMSPropOptimizer's "rms" slot), PyTorch at 0.
                  std::vector<double> init(rmsprop_slots(o).size(), 0.0);
                  init[0] = o.tf_style ? 1.0 : 0.0;
                  return init;
                }()),
      o_(o) {
  check_options("rmsprop", o.lr, o.weight_decay, o.eps);
  check_beta("rmsprop", "alpha", o.alpha);
  ENGINE_CHECK(o.momentum >= 0, "rmsprop: momentum must be >= 0, got ", o.momentum);
}

void RmsProp::update(const ParamUpdates& ts, double weight_decay, int64_t) {
  rmsprop_update(ts, RmsPropStep{lr(), o_.alpha, o_.eps, weight_decay, o_.momentum, o_.centered, o_.tf_style});
}

Adafactor::Adafactor(const NamedTensors& params, const AdafactorOptions& o)
    : Optimizer("adafactor", params, o.lr, o.weight_decay, {}, {}), o_(o) {
  check_options("adafactor", o.lr, o.weight_decay, o.eps1);
  ENGINE_CHECK(o.beta2_decay <= 0, "adafactor: beta2_decay must be <= 0, got ", o.beta2_decay);
  ENGINE_CHECK(o.eps2 >= 0 && o.d > 0, "adafactor: eps2 must be >= 0 and d > 0, got ", o.eps2, " and ", o.d);
}

std::vector<Slot> Adafactor::slots_for(const engine::Shape& shape) const {
  if (shape.size() < 2) return {Slot{"variance", shape, 0.0}};
  engine::Shape rows = shape, cols = shape;
  rows[rows.size() - 1] = 1;
  cols[cols.size() - 2] = 1;
  return {Slot{"row_var", rows, 0.0}, Slot{"col_var", cols, 0.0}};
}

void Adafactor::update(const ParamUpdates& ts, double weight_decay, int64_t step) {
  adafactor_update(ts, AdafactorStep{lr(), o_.beta2_decay, o_.eps1, o_.eps2, o_.d, weight_decay, step});
}

// ---------------------------------------------------------------------------------------------------
// By name

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names = {"sgd", "momentum", "adam", "adamw", "adamax", "rmsprop", "adafactor"};
  return names;
}

std::unique_ptr<Optimizer> make_optimizer(const std::string& name, const NamedTensors& params, double lr,
                                          double weight_decay) {
  if (name == "sgd" || name == "momentum") {
    SgdOptions o;
    o.lr = lr;
    o.weight_decay = weight_decay;
    o.momentum = name == "momentum" ? 0.9 : 0.0;
    return std::make_unique<Sgd>(params, o);
  }
  if (name == "adam" || name == "adamw") {
    AdamOptions o;
    o.lr = lr;
    o.weight_decay = weight_decay;
    if (name == "adam") return std::make_unique<Adam>(params, o);
    return std::make_unique<AdamW>(params, o);
  }
  if (name == "adamax") {
    AdamaxOptions o;
    o.lr = lr;
    o.weight_decay = weight_decay;
    return std::make_unique<Adamax>(params, o);
  }
  if (name == "rmsprop") {
    RmsPropOptions o;
    o.lr = lr;
    o.weight_decay = weight_decay;
    return std::make_unique<RmsProp>(params, o);
  }
  if (name == "adafactor") {
    AdafactorOptions o;
    o.lr = lr;
    o.weight_decay = weight_decay;
    return std::make_unique<Adafactor>(params, o);
  }
  std::string valid;
  for (const std::string& n : optimizer_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw engine::Error(str("unknown optimizer '", name, "': valid optimizers are ", valid));
}

}  // namespace ops
