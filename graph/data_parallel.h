// data_parallel.h: data parallel training's gradient reduction (what PyTorch's DistributedDataParallel Reducer does).
//
// Every rank holds the whole model and runs forward and backward on its own part of the global batch; before the
// update, every gradient becomes the mean over the ranks, so every rank applies the same update and the parameters
// stay identical (they start identical: broadcast_parameters copies rank 0's).
//
// Buckets: the parameters of one optimizer are grouped in reverse registration order (the order backward tends to
// complete them) into buckets of at most `bucket_bytes` (25 MiB by default, as DDP's bucket_cap_mb) and one dtype
// (a parameter larger than that is a bucket of its own). During backward (graph::LeafGradHookScope), a bucket is
// reduced as soon as every gradient in it is complete: the gradients are copied into a flat staging buffer, summed
// over the ranks (Communicator::start_all_reduce_sum: on NCCL the sum runs on the collectives' own stream while
// backward's next kernels run; on Gloo there and then), and when the next bucket needs the staging (or at finish)
// divided by the world size and copied back. So one staging buffer per dtype, the size of the largest bucket, serves
// every bucket, one bucket in flight at a time: it is allocated with the reducer (category `comm`, owner
// "data_parallel.staging.<dtype>") and kept. (PyTorch DDP keeps a buffer per bucket, a second copy of all the
// gradients, and so can have several in flight.) finish() reduces the buckets backward did not complete: a
// parameter without a gradient in this pass counts as zero, and keeps no gradient.
//
// ZeRO (Rajbhandari et al. 2020), as DeepSpeed partitions: the parameters, flattened and laid end to end in
// registration order (T elements), are cut into W equal ranges, [r T / W, (r + 1) T / W) being rank r's shard; a
// parameter across a boundary is shared by two ranks, each updating its piece. Stage 1: each rank's optimizer
// updates only its pieces (their state and f32 masters: 1/W of them; Optimizer::shard), then every piece is
// broadcast from its owner (broadcast_updated). Stage 2 also drops, as soon as their bucket is reduced, the
// gradients of the parameters this rank has no piece of, so that it keeps about 1/W of the gradients (the sum is an
// all-reduce, as DDP's: the memory is ZeRO-2's, the traffic twice a reduce-scatter's), and the gradient norm is
// summed over the ranks' pieces. Stage 3 reduces the gradients as stage 2 does and shards the parameters too
// (graph/parameter_shards.h).
//
// Bucket views (PyTorch DDP's gradient_as_bucket_view): each bucket has a flat buffer of its own (category `grad`,
// owner "data_parallel.bucket<i>", kept), every parameter's .grad is a view into it, zeroed and put back after each
// zero_grad (bind_views), so backward accumulates straight into the buckets: no copies in or out, no staging, but
// every gradient exists for the whole run (forward included), where without views gradients exist only from their
// backward to the update. Every parameter always has a gradient, zero when it got none in a step, as with DDP's
// set_to_none=False. Not with ZeRO-2 (the gradients would stay whole in the buckets).
//
// Which rank reads which data is the model's (models/model.h, Model::set_data_parallel).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/dist.h"
#include "engine/tensor.h"
#include "ops/optim.h"

namespace graph {

constexpr size_t kDefaultBucketBytes = size_t(25) << 20;

class GradientReducer {
 public:
  // `params`: one optimizer's (name, parameter) pairs in registration order; those that do not require grad are
  // left out.
  GradientReducer(std::shared_ptr<engine::dist::Communicator> comm, const ops::NamedTensors& params,
                  size_t bucket_bytes = kDefaultBucketBytes, int zero_stage = 0, bool bucket_view = false);

  // Runs `backward` (one backward pass of the step's last micro-batch) with each bucket reduced as soon as its
  // gradients are complete, then finish().
  void reduce_during(const std::function<void()>& backward);
  // Reduces every bucket not yet reduced in this step (after a backward that ran without the hook, or whose
  // buckets were not all completed), so that every gradient is the mean over the ranks. Idempotent per step.
  void finish();
  // For models whose ranks train different parameters in one step (MT-DNN: each rank's batch is of its own task).
  // Backward's completion order would then differ between the ranks, and the collectives must come in one order on
  // all of them: every bucket is reduced after backward, in bucket order. And a parameter this rank left without a
  // gradient gets the world's mean when `trained(name)` (the model's answer for this step, the same on every rank
  // and on meta) says some rank trains it, so that every rank applies the same update. Set before each step.
  void set_uneven(std::function<bool(const std::string&)> trained);

  struct Bucket {
    std::vector<size_t> params;  // indices into the reducer's parameters, in the bucket's order
    std::vector<int64_t> offsets;
    int64_t numel = 0;
    engine::DType dtype = engine::DType::f32;
    engine::Tensor buffer;  // bucket views: the bucket's own flat buffer (the gradients); else undefined
    size_t ready = 0;       // gradients complete in this pass
    bool reduced = false;   // in this step
  };
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // ZeRO: the piece [begin, end) of flattened parameter `param` (an index into params()) that rank `owner` updates.
  struct Piece {
    size_t param;
    int64_t begin, end;
    int owner;
  };
  const std::vector<Piece>& pieces() const { return pieces_; }
  const std::vector<std::pair<std::string, engine::Tensor>>& params() const { return params_; }
  // ZeRO-3: the parameters' shards, told of every complete gradient in the step's last backward; they release the
  // parameters after backward (finish).
  void set_parameter_shards(class ParameterShards* shards) { shards_ = shards; }
  const engine::dist::Communicator& communicator() const { return *comm_; }
  // The bytes the reducer holds: the staging buffers, or the buckets' own buffers with bucket views.
  size_t held_bytes() const;
  int zero_stage() const { return zero_stage_; }
  bool bucket_view() const { return bucket_view_; }
  // Bucket views: zeroes the buckets and makes every parameter's .grad its view (after each zero_grad).
  void bind_views();
  // ZeRO: the piece [begin, end) of flattened parameter `name` this rank updates (all of it at stage 0 and for a
  // name that is not one of the reducer's), and the parameters it has a piece of.
  std::pair<int64_t, int64_t> range_of(const std::string& name) const;
  std::vector<std::string> shard() const;
  int64_t shard_elements() const;  // the elements of this rank's pieces (all of them at stage 0)
  // ZeRO: after the ranks' updates of their shards, every piece becomes its owner's (a broadcast each).
  void broadcast_updated();
  // ZeRO-2: the L2 norm of the world's gradients: the squares of this rank's pieces, summed over the ranks.
  double global_grad_norm() const;

 private:
  // A bucket's reduction in two halves: reduce() copies its gradients into the staging (unless they are views into
  // the bucket) and starts the sum (Communicator::start_all_reduce_sum: on NCCL it runs beside the rest of
  // backward); take_back() waits for it, divides by the world size and copies the means back (ZeRO-2/3 drop the
  // gradients this rank has no piece of). One bucket is in flight at a time: the next reduce() or finish() takes it
  // back first (the staging is one buffer).
  void reduce(Bucket& b);
  void take_back(Bucket& b);
  // Where bucket b's gradients are summed: its own buffer (bucket views) or the front of its dtype's staging.
  engine::Tensor flat_of(const Bucket& b) const;
  // The gradient of the j-th parameter of bucket b inside `flat` (the bucket's buffer or the staging): a view.
  engine::Tensor gradient_in(const engine::Tensor& flat, const Bucket& b, size_t j) const;

  std::shared_ptr<engine::dist::Communicator> comm_;
  std::vector<std::pair<std::string, engine::Tensor>> params_;
  std::map<const engine::TensorImpl*, size_t> index_;  // a parameter's position in params_, for the backward hook
  std::vector<size_t> bucket_of_;                      // per parameter
  std::vector<Piece> pieces_;   // ZeRO: every parameter's pieces, by owner
  std::vector<bool> has_mine_;  // per parameter: whether this rank updates a piece of it
  int zero_stage_ = 0;
  bool bucket_view_ = false;
  std::function<bool(const std::string&)> trained_;  // set_uneven: reduce at the end, fill missing gradients
  std::map<engine::DType, engine::Tensor> staging_;  // without bucket views: one per dtype, the largest bucket's
  std::vector<Bucket> buckets_;
  class ParameterShards* shards_ = nullptr;
  Bucket* in_flight_ = nullptr;  // started, not yet taken back
};

// Copies rank 0's values of every parameter to the other ranks (DDP does this when it wraps a model), so that the
// ranks start from the same weights whatever their seeds.
void broadcast_parameters(engine::dist::Communicator& comm, const ops::NamedTensors& params);

}  // namespace graph
