// optimizer.h: the optimizers (SGD, Adam, AdamW, Adamax, RMSProp, Adafactor) that hold a model's parameters and
// their state.
//
// An Optimizer holds the (name, parameter) pairs of a Module (named_parameters()) and, per parameter, its
// state tensors ("slots": Adam's exp_avg and exp_avg_sq, ...). The math of every optimizer is PyTorch's
// (torch.optim, single-tensor path), written out at each class below; RMSProp also has TensorFlow's variant.
//
// Memory: slots are allocated lazily, on a parameter's first step, inside CategoryScope(optimizer) and
// PhaseScope(optimizer), owned by "<param name>/<optimizer>"; so the ledger shows optimizer state appear
// after the first step (Adam: 2 x the parameter bytes), which is why a max-batch probe runs until every parameter has
// been updated (tools/max_batch.h).
// Updates run under graph::NoGrad as fused multi-tensor ops (ops/optim.h): one op per set of parameters that
// share their hyperparameters (weight decay on or off, step count), one pass over each param, grad and slots,
// no temporaries. Parameters whose grad is undefined are skipped (their slots and step count do not move), as
// in PyTorch.
//
// Checkpoints: state() gives the slots as named tensors ("encoder.x.weight.exp_avg") plus string
// metadata (optimizer name, step counts): exactly what engine/safetensors.h stores, so
//   auto s = opt.state(); save_safetensors(path, s.tensors, s.metadata);
//   opt.load_state(load_safetensors(path, dev), read_safetensors_metadata(path));
// resumes bit-exactly.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"
#include "ops/optim.h"

namespace ops {

// ---------------------------------------------------------------------------------------------------
// The optimizer interface.

// One state tensor of a parameter: its name (the checkpoint's "<param name>.<name>"), shape and initial value.
struct Slot {
  std::string name;
  engine::Shape shape;
  double initial = 0;
};

struct OptimizerState {
  NamedTensors tensors;                          // "<param name>.<slot>"
  std::map<std::string, std::string> metadata;  // "optimizer", "optimizer.step", "optimizer.step.<param>"
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter whose grad is defined.
  void step();
  // Allocates the state (slots) of every parameter whose grad is defined and that has none yet, updating
  // nothing: the slots hold their initial values and the step counts do not move, so the next step() is the
  // same as without it. Model::train_step calls it when an fp16 step's update is skipped for overflow, so the
  // arena's layout never depends on whether a gradient overflowed (meta, which sees no values, never skips).
  void allocate_state();
  // The trainable parameters (requires_grad) that have no state yet; empty once every one has been updated
  // (or allocate_state() saw its grad). The max-batch finder checks it at the end of every probe.
  std::vector<std::string> params_without_state() const;
  // Drops every parameter's gradient: its memory goes back to the arena (PyTorch's set_to_none=True). Then runs
  // the hook of set_after_zero_grad, if any (data parallel's bucket views put zeroed views in their place).
  void zero_grad();
  void set_after_zero_grad(std::function<void()> hook) { after_zero_grad_ = std::move(hook); }
  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }
  // step() calls so far (a parameter skipped for lack of a grad has its own, smaller count).
  int64_t step_count() const { return step_count_; }
  const char* name() const { return name_; }
  double weight_decay() const { return weight_decay_; }
  // Whether parameter `name` gets weight decay (false once exclude_from_weight_decay excluded it).
  bool decays(const std::string& name) const;
  // Parameters for which `excluded(name)` is true get no weight decay (BERT: biases and LayerNorm).
  void exclude_from_weight_decay(const std::function<bool(const std::string&)>& excluded);
  // Mixed precision: from now on parameter `name` (bf16/f16) is updated through the f32 `master` copy,
  // which the optimizer owns (state tensor "<name>.master", tagged `optimizer`, owner "<name>/master");
  // its slots are f32. Called by models/precision.cpp when it lowers the parameters.
  void set_master_weight(const std::string& name, const Tensor& master);
  Tensor master_weight(const std::string& name) const;  // undefined without one
  bool holds(const std::string& name) const;            // whether parameter `name` is one of this optimizer's
  // ZeRO (graph/data_parallel.h): from now on this optimizer updates only elements [begin, end) of each flattened
  // parameter, range(name) = {begin, end}: its state and f32 master are of that piece only (the master's piece is
  // copied out, the whole freed); a parameter with an empty range gets no state and loses its master (other ranks
  // update it and broadcast the result); {-1, -1}: all of it. zero_grad still drops every gradient. Not for
  // Adafactor (its factored state needs whole matrices). State that exists already (a checkpoint loaded whole) is
  // cut to the pieces the same way: resharding a world's checkpoint into any world size.
  void shard(const std::function<std::pair<int64_t, int64_t>(const std::string&)>& range);
  // ZeRO-3 (graph/parameter_shards.h): from now on the update of parameter `name` writes its piece into
  // stored(name), this rank's own copy of it (the parameter's block is released between uses), not into the
  // parameter; an undefined answer: into the parameter. Call after shard().
  void store_pieces_in(const std::function<Tensor(const std::string&)>& stored);
  // The state as one unsharded optimizer's (a sharded world's checkpoint, the same as plain data parallel's): every
  // rank calls it, in the same order. `assemble(t)` turns a tensor that holds this rank's pieces, zeros elsewhere,
  // into the whole on every rank (a sum over the ranks); `assemble_counts` the same for host numbers. The whole
  // state is built one tensor at a time and kept: every rank holds it all when this returns (the caller writes it
  // from one rank). Without shards it is state().
  OptimizerState full_state(const std::function<void(const Tensor&)>& assemble,
                            const std::function<void(std::vector<double>&)>& assemble_counts) const;
  // Multiplies every gradient by `scale` inside the update (fp16 loss scaling divides by the loss scale
  // there instead of in a separate pass); 1 by default. Or, when scale_by is given, by its element 0 (f64 on the
  // parameters' device: a factor computed there, ops::clip_coefficient, read by the update as it runs); the
  // optimizer keeps it until the next call. Only where reads_device_scale().
  void set_grad_scale(double scale, const Tensor& scale_by = Tensor());
  virtual bool reads_device_scale() const { return true; }

  // The state for a checkpoint (tensors are shared, not copied) and its restoration. load_state checks
  // the optimizer name, every tensor's shape, dtype and device, and that every parameter with a step
  // count has all its slots; the loaded tensors are adopted, not copied (retagged `optimizer`, owner
  // "<param>/<optimizer>"), so load them onto the parameters' device.
  OptimizerState state() const;
  void load_state(const std::map<std::string, Tensor>& tensors, const std::map<std::string, std::string>& metadata);

 protected:
  Optimizer(const char* name, const NamedTensors& params, double lr, double weight_decay,
            std::vector<std::string> slot_names, std::vector<double> slot_initial_values);
  // The update of parameters that share `weight_decay` and `step` (their updates so far, this one included).
  virtual void update(const ParamUpdates& ts, double weight_decay, int64_t step) = 0;
  // The state tensors of a parameter of `shape`, in the order update() receives them: by default one per slot name
  // given to the constructor, each of the parameter's shape.
  virtual std::vector<Slot> slots_for(const engine::Shape& shape) const;

 private:
  struct Entry {
    std::string name;
    Tensor param;
    Tensor master;              // f32 master weight (mixed precision) or undefined
    std::vector<Tensor> slots;  // empty until the first step
    bool has_state = false;     // slots allocated (an optimizer may have none: SGD without momentum)
    int64_t steps = 0;
    bool decay = true;
    bool owned = true;  // false: another rank's shard (ZeRO), not updated here
    int64_t begin = 0, end = -1;          // ZeRO: the piece of the flattened parameter updated here; end < 0: all of it
    Tensor stored;                        // ZeRO-3: where the piece lives (store_pieces_in); undefined: in param
    Tensor piece(const Tensor& t) const;  // t's elements [begin, end) (t itself when the entry is whole)
    Tensor target() const { return stored.defined() ? stored : piece(param); }  // what the update writes
    engine::Shape state_shape() const;
  };
  void allocate_slots(Entry& e) const;
  static void set_master_weight_unchecked(Entry& e, const Tensor& master);

  const char* name_;
  std::vector<Entry> entries_;
  std::vector<std::string> slot_names_;
  std::vector<double> slot_initial_values_;
  double lr_, weight_decay_;
  double grad_scale_ = 1;
  Tensor grad_scale_by_;  // set_grad_scale's scale_by, or undefined
  int64_t step_count_ = 0;
  std::function<void()> after_zero_grad_;
};

// ---------------------------------------------------------------------------------------------------
// SGD (torch.optim.SGD):  g += wd * p;  with momentum m:  b = g on the first step, else
// b = m * b + (1 - dampening) * g;  g = nesterov ? g + m * b : b;  p -= lr * g.
// (fairseq's NAG, which ConvS2S uses, is this with nesterov=true, dampening 0 and wd 0 while lr is
// constant; it rescales its buffer when lr changes and decays weights decoupled.)
struct SgdOptions {
  double lr = 0.01, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};
class Sgd : public Optimizer {
 public:
  Sgd(const NamedTensors& params, const SgdOptions& o);
 private:
  void update(const ParamUpdates& ts, double weight_decay, int64_t step) override;
  SgdOptions o_;
};

// Adam (torch.optim.Adam) and AdamW (torch.optim.AdamW), t = the parameter's step:
//   Adam: g += wd * p        AdamW: p *= 1 - lr * wd
//   m = b1 * m + (1 - b1) * g;   v = b2 * v + (1 - b2) * g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)      (eps outside the sqrt)
struct AdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
};
class Adam : public Optimizer {
 public:
  Adam(const NamedTensors& params, const AdamOptions& o);
 protected:
  Adam(const char* name, const NamedTensors& params, const AdamOptions& o, bool decoupled);
 private:
  void update(const ParamUpdates& ts, double weight_decay, int64_t step) override;
  AdamOptions o_;
  bool decoupled_;
};
// AdamW: set weight_decay explicitly (PyTorch's AdamW defaults to 0.01; AdamOptions to 0).
class AdamW : public Adam {
 public:
  AdamW(const NamedTensors& params, const AdamOptions& o);
};

// Adamax (torch.optim.Adamax), the infinity-norm Adam:
//   g += wd * p;  m = b1 * m + (1 - b1) * g;  u = max(b2 * u, |g| + eps);  p -= lr / (1 - b1^t) * m / u
struct AdamaxOptions {
  double lr = 2e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
};
class Adamax : public Optimizer {
 public:
  Adamax(const NamedTensors& params, const AdamaxOptions& o);
 private:
  void update(const ParamUpdates& ts, double weight_decay, int64_t step) override;
  AdamaxOptions o_;
};

// RMSProp, two conventions (g += wd * p first in both):
//  PyTorch (torch.optim.RMSprop; square_avg starts at 0):
//    v = a * v + (1 - a) * g^2;  centered: ga = a * ga + (1 - a) * g, d = sqrt(v - ga^2) + eps, else
//    d = sqrt(v) + eps;  momentum: b = mom * b + g / d, p -= lr * b;  else p -= lr * g / d.
//  TensorFlow (tf_style: tf.train.RMSPropOptimizer / ApplyRMSProp, which the NASNet recipe uses with
//  decay 0.9, momentum 0.9, eps 1.0; square_avg starts at 1, as TF initializes its "rms" slot):
//    v = a * v + (1 - a) * g^2;  d = sqrt(v [- ga^2] + eps)      (eps INSIDE the sqrt)
//    b = mom * b + lr * g / d;  p -= b                           (lr inside the buffer)
//  With eps = 1.0 the two differ a lot: sqrt(v + 1) ~ 1 while sqrt(v) + 1 >= 1 (and v starts at 1 in TF).
struct RmsPropOptions {
  double lr = 1e-2, alpha = 0.99, eps = 1e-8, weight_decay = 0, momentum = 0;
  bool centered = false;
  bool tf_style = false;
};
class RmsProp : public Optimizer {
 public:
  RmsProp(const NamedTensors& params, const RmsPropOptions& o);
 private:
  void update(const ParamUpdates& ts, double weight_decay, int64_t step) override;
  RmsPropOptions o_;
};

// Adafactor (torch.optim.Adafactor; Shazeer & Stern 2018), t = the parameter's step, n = its element count:
//   b = t^beta2_decay (the weight of the new square: 1 at t = 1);  rho = min(lr, 1 / sqrt(t))
//   alpha = max(eps2, RMS(p)) * rho  (before the decay);  p *= 1 - lr * wd
//   2 or more dims, factored over the last two (rows i, columns j): R = lerp(R, mean_j g^2, b), C = lerp(C, mean_i g^2,
//   b), V = R C / max(mean_i R, eps1);  fewer dims: V = lerp(V, g^2, b)
//   U = g / sqrt(max(V, eps1^2));  p -= alpha / max(1, RMS(U) / d) * U
// eps1 = 0 means the epsilon of the weight's dtype (PyTorch's None). Its state is the factors R (the shape with its
// last dimension 1) and C (the shape with its second-to-last 1), or V for vectors: about sqrt of Adam's.
struct AdafactorOptions {
  double lr = 1e-2, beta2_decay = -0.8, eps1 = 0, eps2 = 1e-3, d = 1.0, weight_decay = 0;
};
class Adafactor : public Optimizer {
 public:
  Adafactor(const NamedTensors& params, const AdafactorOptions& o);
  bool reads_device_scale() const override { return false; }  // its update is made of ops taking host scalars

 private:
  void update(const ParamUpdates& ts, double weight_decay, int64_t step) override;
  std::vector<Slot> slots_for(const engine::Shape& shape) const override;
  AdafactorOptions o_;
};

// ---------------------------------------------------------------------------------------------------
// Optimizers by name (engine_train --optimizer): sgd, momentum (SGD, momentum 0.9), adam, adamw, adamax, rmsprop,
// adafactor, each with PyTorch's defaults but the given learning rate and weight decay.
const std::vector<std::string>& optimizer_names();
std::unique_ptr<Optimizer> make_optimizer(const std::string& name, const NamedTensors& params, double lr,
                                          double weight_decay);

}  // namespace ops
