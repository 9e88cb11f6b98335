// autograd.h: grad mode, recording ops, and running backward.
//
//   backward(loss)                     d loss / d leaf accumulated into every leaf's .grad()
//   grad({y}, {x}, {}, create_graph)   d y / d x returned, nothing accumulated (R1 penalty, grad checks)
//   NoGrad ng;                         nothing recorded in this scope (inference, optimizer steps)
//   recompute(fn, inputs)              activation checkpointing: fn's intermediates are not saved; fn runs
//                                      again during backward (with the same random numbers)
#pragma once
#include <functional>
#include <initializer_list>
#include <vector>

#include "graph/node.h"

namespace graph {

bool grad_enabled();
void set_grad_enabled(bool on);

class NoGrad {
 public:
  NoGrad() : saved_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGrad() { set_grad_enabled(saved_); }
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;
 private:
  bool saved_;
};

class EnableGrad {
 public:
  explicit EnableGrad(bool on = true) : saved_(grad_enabled()) { set_grad_enabled(on); }
  ~EnableGrad() { set_grad_enabled(saved_); }
  EnableGrad(const EnableGrad&) = delete;
  EnableGrad& operator=(const EnableGrad&) = delete;
 private:
  bool saved_;
};

// True when grad mode is on and any of the tensors requires grad: the op must record a node.
bool any_requires_grad(std::initializer_list<Tensor> tensors);
bool any_requires_grad(const std::vector<Tensor>& tensors);

// Records a node for an op. `saved` may contain inputs and outputs; outputs are detected and stored
// without their grad_fn (see node.h). Outputs get requires_grad and grad_fn set.
std::shared_ptr<Node> record(const char* name, const std::vector<Tensor>& inputs,
                             const std::vector<Tensor>& outputs, const std::vector<Tensor>& saved,
                             Node::Rule rule);

// The same for an op whose results are optional (a backward op's dx, dweight, dbias, each computed only when
// asked for): the defined ones become the node's outputs, and `rule` receives the upstream gradient of every
// result by its position in `results` (undefined for a result that was not computed).
std::shared_ptr<Node> record_optional(const char* name, const std::vector<Tensor>& inputs,
                                      const std::vector<Tensor>& results, const std::vector<Tensor>& saved,
                                      Node::Rule rule);

// Accumulates d(roots)/d(leaves) into leaf.grad. grad_roots default to ones for one-element roots.
void backward(const Tensor& root, const Tensor& grad_root = Tensor(), bool create_graph = false,
              bool retain_graph = false);
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
              bool create_graph = false, bool retain_graph = false);

// Returns d(outputs)/d(inputs) without touching any .grad. With create_graph the result is differentiable.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool create_graph = false,
                         bool retain_graph = false);

// Gradient readiness (data parallel, graph/data_parallel.h): while a LeafGradHook is installed, backward() calls it
// once per leaf as soon as that leaf's .grad is complete for the pass (after the last of its accumulations: a leaf
// used by several ops has one AccumulateGrad node per use), with the leaf.
// grad() (which accumulates nothing) never calls it. One hook per thread; the scope restores the previous one.
using LeafGradHook = std::function<void(const engine::TensorImpl* leaf)>;
class LeafGradHookScope {
 public:
  explicit LeafGradHookScope(LeafGradHook hook);
  ~LeafGradHookScope();
  LeafGradHookScope(const LeafGradHookScope&) = delete;
  LeafGradHookScope& operator=(const LeafGradHookScope&) = delete;

 private:
  LeafGradHook saved_;
};

// In-place accumulation, for backward rules. While a rule runs (not under create_graph), the gradient that input
// `input` of its node has already received from its other consumers, when the rule may add its own into it in
// place: the engine holds the only reference, and it is one whole contiguous block of the input's shape and of
// dtype `dtype`. A rule that takes it must add its gradient for that input into it and return that tensor as the
// input's gradient; the engine then adds nothing (one sum kernel and one buffer fewer). Undefined otherwise: the
// rule returns its own gradient, and the engine sums the two as usual. (ops::linear's rule takes it: x's gradient
// from a residual branch is added by the g W product itself, as beta = 1 in BLAS.) A function of the graph alone,
// so every device takes the same path and meta still predicts the ledger.
Tensor pending_gradient(size_t input, engine::DType dtype);

// Activation checkpointing.
using RecomputeFn = std::function<Tensor(const std::vector<Tensor>&)>;
Tensor recompute(const RecomputeFn& fn, const std::vector<Tensor>& inputs);
// True while recompute runs fn a second time (in backward): code with side effects that must happen once per
// step (batch norm's running-statistics update) skips them then.
bool recomputing();

}  // namespace graph
