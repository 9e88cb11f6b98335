// parameter_shards.h: ZeRO-3 (Rajbhandari et al. 2020; PyTorch's FSDP): the parameters themselves sharded over the
// ranks, whole only while a module that needs them runs.
//
// The shards are ZeRO's pieces (graph/data_parallel.h: the parameters laid end to end in registration order, cut
// into W equal ranges): each rank keeps its pieces in tensors of their own (category `param`, owner
// "<name>/shard"), which its optimizer updates (Optimizer::store_pieces_in). Every parameter's own block is given
// back to the arena (engine::Storage::release) except while its unit is gathered.
//
// Units (FSDP's wrapped modules): each layer of a stack, the outermost modules whose local name ends in a number
// ("encoder.layer.3", "layers.5", "layer2.1", "cell_7"), is a unit; everything else (embeddings, stems, heads, and
// any parameter that two modules hold) is the root unit. A unit is gathered (its parameters' blocks allocated again and
// each piece broadcast from its owner) when its forward begins (Module::scope, a ForwardObserver) and released
// when it ends; the root is gathered for the whole of a step's forward and backward (Model::train_step). In
// backward a unit is gathered again when a node needs a tensor saved from it (engine::Storage::on_use), and released
// once every one of its parameters' gradients is complete (the leaf hook of graph/autograd.h); recomputation
// (activation checkpointing) gathers what it runs and releases nothing. After backward only the shards remain.
//
// So a rank holds its shards (1/W of the parameters), the root unit during the step, and the units in flight: one
// in forward (two, nested); in backward those whose gradients are not all complete. The gradients are ZeRO-2's
// (reduced in buckets, only this rank's pieces kept); the gathers are broadcasts from each piece's owner (NCCL and
// Gloo would do an all-gather of the unit in one call: the bytes are the same). Every rank must run the same
// modules in the same order (models whose ranks train different heads, MT-DNN, cannot use it).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/dist.h"
#include "graph/data_parallel.h"
#include "graph/module.h"

namespace graph {

class ParameterShards : public ForwardObserver {
 public:
  // `reducer`: the gradient reducer of the model's one optimizer (its pieces are the shards); `root`: the module
  // tree that holds its parameters. Keeps this rank's pieces and releases every parameter's block.
  ParameterShards(std::shared_ptr<engine::dist::Communicator> comm, const GradientReducer& reducer, Module& root);
  ~ParameterShards() override;
  ParameterShards(const ParameterShards&) = delete;
  ParameterShards& operator=(const ParameterShards&) = delete;

  struct Unit {
    std::string name;            // the module's dotted path; "" for the root
    std::vector<size_t> params;  // indices into the reducer's parameters
    size_t bytes = 0;            // the parameters' bytes, whole
    bool gathered = false;
    size_t complete = 0;  // parameters whose gradient is complete in this backward pass
  };
  const std::vector<Unit>& units() const { return units_; }
  // This rank's pieces (undefined for a parameter it has none of), by the reducer's parameter index, and their bytes.
  const Tensor& stored(size_t param) const { return stored_[param]; }
  Tensor stored(const std::string& name) const;
  size_t shard_bytes() const;

  void entered(const Module& m) override;  // the unit's forward begins: gathered
  void left(const Module& m) override;     // ends: released (not in backward: recomputation)
  void gather_root();                      // before a step's first forward
  void gather_all();                       // every parameter whole (a checkpoint); release_all() after
  void release_all();                      // after backward: only the shards remain
  // Backward: the counts of complete gradients start again; `leaf`'s gradient is complete (its unit is released
  // when all of its parameters' are).
  void begin_backward();
  void gradient_complete(const engine::TensorImpl* leaf);
  // Runs `backward` (a micro-batch's, before the step's last: no gradient reduction) releasing each unit as soon as
  // its gradients are complete.
  void release_during(const std::function<void()>& backward);

 private:
  void gather(size_t unit);
  void release(size_t unit);

  std::shared_ptr<engine::dist::Communicator> comm_;
  const GradientReducer& reducer_;
  std::vector<Unit> units_;      // units_[0] is the root
  std::vector<size_t> unit_of_;  // per reducer parameter
  std::map<const Module*, size_t> unit_of_module_;
  std::map<const engine::TensorImpl*, size_t> index_;  // a parameter's index
  std::vector<Tensor> stored_;                         // per reducer parameter
  std::vector<Module*> observed_;
};

}  // namespace graph
