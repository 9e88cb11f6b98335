// data_parallel.cpp: gradient buckets reduced over the ranks as backward completes them.
#include "graph/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "engine/context.h"
#include "engine/error.h"
#include "engine/format.h"
#include "graph/autograd.h"
#include "graph/parameter_shards.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/optim.h"
#include "ops/view.h"

namespace graph {

using engine::Category;
using engine::Tensor;

namespace {
// Elements [begin, end) of t flattened: a view.
Tensor flat_piece(const Tensor& t, int64_t begin, int64_t end) { return ops::slice(ops::flatten(t), 0, begin, end); }
}  // namespace

GradientReducer::GradientReducer(std::shared_ptr<engine::dist::Communicator> comm, const ops::NamedTensors& params,
                                 size_t bucket_bytes, int zero_stage, bool bucket_view)
    : comm_(std::move(comm)), zero_stage_(zero_stage), bucket_view_(bucket_view) {
  ENGINE_CHECK(bucket_bytes > 0, "data parallel: a bucket size of 0 bytes; give --bucket-mb 1 or more");
  ENGINE_CHECK(zero_stage >= 0 && zero_stage <= 3, "--zero ", zero_stage,
               ": the stages are 0 (plain data parallel), 1 (optimizer state sharded), 2 (gradients too) and 3 "
               "(parameters too)");
  ENGINE_CHECK(!bucket_view || zero_stage < 2,
               "--bucket-view keeps every gradient inside its bucket, so ZeRO-2 could "
               "not drop the other ranks' gradients: use it with --zero 0 or 1, or drop it");
  for (const auto& [name, p] : params)
    if (p.requires_grad()) index_[p.impl()] = params_.size(), params_.push_back({name, p});
  // ZeRO's shards: rank r owns elements [r T / W, (r + 1) T / W) of the parameters laid end to end.
  int64_t total = 0;
  for (const auto& np : params_) total += np.second.numel();
  const int world = comm_->world_size();
  auto bound = [&](int r) { return int64_t((__int128)total * r / world); };
  has_mine_.assign(params_.size(), false);
  int64_t at = 0;
  for (size_t k = 0; k < params_.size(); k++) {
    const int64_t n = params_[k].second.numel();
    for (int r = 0; r < world; r++) {
      const int64_t lo = std::max(at, bound(r)), hi = std::min(at + n, bound(r + 1));
      if (lo >= hi) continue;
      pieces_.push_back({k, lo - at, hi - at, r});
      if (r == comm_->rank()) has_mine_[k] = true;
    }
    at += n;
  }
  bucket_of_.assign(params_.size(), 0);
  // Reverse registration order, one open bucket per dtype, closed when the next parameter would overflow it.
  std::map<engine::DType, size_t> open;  // dtype -> index into buckets_
  std::vector<size_t> bytes;             // per bucket
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k].second;
    const size_t nb = p.nbytes();
    auto it = open.find(p.dtype());
    if (it == open.end() || bytes[it->second] + nb > bucket_bytes) {
      buckets_.emplace_back();
      bytes.push_back(0);
      it = open.insert_or_assign(p.dtype(), buckets_.size() - 1).first;
    }
    Bucket& b = buckets_[it->second];
    b.offsets.push_back(b.params.empty() ? 0 : b.offsets.back() + params_[b.params.back()].second.numel());
    b.params.push_back(k);
    bytes[it->second] += nb;
    bucket_of_[k] = it->second;
  }
  for (Bucket& b : buckets_) {
    const Tensor& last = params_[b.params.back()].second;
    b.numel = b.offsets.back() + last.numel();
    b.dtype = last.dtype();
  }
  const std::shared_ptr<engine::Device> device = params_.empty() ? nullptr : params_.front().second.device_ptr();
  if (bucket_view_) {
    engine::CategoryScope category(Category::grad);
    for (size_t i = 0; i < buckets_.size(); i++) {
      engine::MemoryScope owner(engine::str("data_parallel.bucket", i));
      buckets_[i].buffer = Tensor::empty({buckets_[i].numel}, buckets_[i].dtype, device);
    }
    bind_views();
  } else {
    std::map<engine::DType, int64_t> largest;
    for (const Bucket& b : buckets_) largest[b.dtype] = std::max(largest[b.dtype], b.numel);
    engine::CategoryScope category(Category::comm);
    for (const auto& [dtype, numel] : largest) {
      engine::MemoryScope owner(engine::str("data_parallel.staging.", engine::dtype_name(dtype)));
      staging_[dtype] = Tensor::empty({numel}, dtype, device);
    }
  }
}

Tensor GradientReducer::flat_of(const Bucket& b) const {
  return bucket_view_ ? b.buffer : ops::slice(staging_.at(b.dtype), 0, 0, b.numel);
}

Tensor GradientReducer::gradient_in(const Tensor& flat, const Bucket& b, size_t j) const {
  const Tensor& p = params_[b.params[j]].second;
  return ops::reshape(ops::slice(flat, 0, b.offsets[j], b.offsets[j] + p.numel()), p.shape());
}

void GradientReducer::bind_views() {
  NoGrad no_grad;
  for (Bucket& b : buckets_) {
    ops::fill_(b.buffer, 0.0);
    for (size_t j = 0; j < b.params.size(); j++) params_[b.params[j]].second.set_grad(gradient_in(b.buffer, b, j));
  }
}

void GradientReducer::set_uneven(std::function<bool(const std::string&)> trained) { trained_ = std::move(trained); }

void GradientReducer::reduce_during(const std::function<void()>& backward) {
  if (trained_) {  // uneven: no reduction during backward (the ranks would complete the buckets in other orders)
    backward();
    finish();
    return;
  }
  {
    LeafGradHookScope hook([&](const engine::TensorImpl* leaf) {
      auto it = index_.find(leaf);
      if (it == index_.end()) return;  // another network's parameter (a GAN's G step reaches D's weights)
      Bucket& b = buckets_[bucket_of_[it->second]];
      if (++b.ready == b.params.size() && !b.reduced) reduce(b);
      if (shards_) shards_->gradient_complete(leaf);
    });
    if (shards_) shards_->begin_backward();
    backward();
  }
  finish();
}

void GradientReducer::finish() {
  for (Bucket& b : buckets_)
    if (!b.reduced) reduce(b);
  if (in_flight_) take_back(*in_flight_);
  for (Bucket& b : buckets_) b.ready = 0, b.reduced = false;
  if (shards_) shards_->release_all();
}

size_t GradientReducer::held_bytes() const {
  size_t n = 0;
  for (const Bucket& b : buckets_) n += b.buffer.defined() ? b.buffer.nbytes() : 0;
  for (const auto& [dtype, t] : staging_) n += t.nbytes();
  return n;
}

void GradientReducer::reduce(Bucket& b) {
  if (in_flight_) take_back(*in_flight_);  // its staging (or its turn on the collectives' stream) is needed
  NoGrad no_grad;
  const Tensor flat = flat_of(b);
  for (size_t j = 0; j < b.params.size(); j++) {
    const Tensor view = gradient_in(flat, b, j), g = params_[b.params[j]].second.grad();
    // With bucket views backward accumulated into the bucket itself (unless something replaced the view).
    if (!g.defined())
      ops::fill_(view, 0.0);
    else if (g.data_ptr() != view.data_ptr())
      ops::copy_(view, g);
  }
  comm_->start_all_reduce_sum(flat);  // NCCL: runs beside the rest of backward until take_back
  b.reduced = true;
  in_flight_ = &b;
}

void GradientReducer::take_back(Bucket& b) {
  NoGrad no_grad;
  in_flight_ = nullptr;
  comm_->wait();
  const Tensor flat = flat_of(b);
  if (comm_->world_size() > 1) ops::mul_(flat, 1.0 / comm_->world_size());
  for (size_t j = 0; j < b.params.size(); j++) {
    Tensor p = params_[b.params[j]].second;
    const Tensor g = p.grad(), view = gradient_in(flat, b, j);
    if (!g.defined() && trained_ && trained_(params_[b.params[j]].first) &&
        (zero_stage_ < 2 || has_mine_[b.params[j]])) {
      engine::CategoryScope category(engine::Category::grad);  // another rank trained it: the world's mean here too
      p.set_grad(ops::clone(view));
      continue;
    }
    if (!g.defined()) continue;
    if (zero_stage_ >= 2 && !has_mine_[b.params[j]])
      p.set_grad(Tensor());  // other ranks update it
    else if (g.data_ptr() != view.data_ptr())
      ops::copy_(g, view);
  }
}

std::pair<int64_t, int64_t> GradientReducer::range_of(const std::string& name) const {
  for (size_t k = 0; k < params_.size(); k++) {
    if (params_[k].first != name) continue;
    if (zero_stage_ == 0) return {0, params_[k].second.numel()};
    for (const Piece& p : pieces_)
      if (p.param == k && p.owner == comm_->rank()) return {p.begin, p.end};
    return {0, 0};
  }
  return {-1, -1};  // not one of this reducer's parameters
}

std::vector<std::string> GradientReducer::shard() const {
  std::vector<std::string> names;
  for (size_t k = 0; k < params_.size(); k++)
    if (zero_stage_ == 0 || has_mine_[k]) names.push_back(params_[k].first);
  return names;
}

int64_t GradientReducer::shard_elements() const {
  int64_t n = 0;
  for (const Piece& p : pieces_)
    if (zero_stage_ == 0 || p.owner == comm_->rank()) n += p.end - p.begin;
  return n;
}

void GradientReducer::broadcast_updated() {
  if (zero_stage_ == 0 || zero_stage_ == 3) return;  // ZeRO-3: the next gather broadcasts the updated pieces
  NoGrad no_grad;
  for (const Piece& p : pieces_) comm_->broadcast(flat_piece(params_[p.param].second, p.begin, p.end), p.owner);
}

double GradientReducer::global_grad_norm() const {
  NoGrad no_grad;
  std::vector<Tensor> mine;
  for (const Piece& p : pieces_) {
    if (p.owner != comm_->rank()) continue;
    const Tensor g = params_[p.param].second.grad();
    if (g.defined()) mine.push_back(flat_piece(g, p.begin, p.end));
  }
  std::vector<double> sum = {0.0};
  if (!mine.empty())
    for (double s : ops::squared_norms(mine).to_double()) sum[0] += s;
  comm_->all_reduce_host(sum);
  return std::sqrt(sum[0]);
}

void broadcast_parameters(engine::dist::Communicator& comm, const ops::NamedTensors& params) {
  for (const auto& [name, p] : params) {
    ENGINE_CHECK(p.is_contiguous(), "broadcast_parameters: ", name, " is not contiguous");
    comm.broadcast(p, 0);
  }
}

}  // namespace graph
