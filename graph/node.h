// node.h: one recorded op in the autograd graph.
//
// Define-by-run: when an op runs with grad enabled and some input requires grad, it records a Node with
//   - edges to the nodes that produced its inputs (an AccumulateGrad node for a leaf such as a parameter),
//   - the tensors its backward rule needs (saved tensors: retagged `activation` in the ledger),
//   - the backward rule itself: a function from the gradients of the outputs to the gradients of the
//     inputs, written with engine ops, so that under create_graph it is itself recorded (double backward).
// backward() releases a node's saved tensors as soon as its rule has run: activation memory falls during
// the backward pass, and the ledger shows it.
//
// A saved tensor that is an output of the node itself is kept without its grad_fn (that would be a
// reference cycle node -> tensor -> node); saved(i) re-attaches it while the rule runs, so the rule stays
// differentiable with respect to it.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace graph {

using engine::Shape;
using engine::Tensor;

struct Node;

struct Edge {
  std::shared_ptr<Node> node;  // nullptr: that input needs no gradient
  int input_nr = 0;            // which output of `node` the input was
};

struct SavedTensor {
  Tensor data;
  bool defined = true;  // an undefined tensor (an optional argument) is saved as such
  bool is_output = false;
  int output_nr = 0;
};

struct OutputMeta {
  Shape shape;
  engine::DType dtype;
  std::shared_ptr<engine::Device> device;
};

struct Node : std::enable_shared_from_this<Node> {
  using Rule = std::function<std::vector<Tensor>(Node& self, const std::vector<Tensor>& grad_outputs)>;

  std::string name;            // op name, e.g. "softmax"
  std::string backward_name;   // "softmax_backward": the owner tag of blocks the rule allocates
  std::string scope;           // module scope when the op ran, e.g. "encoder.layer.3.attention"
  std::vector<Edge> next;      // one per input
  std::vector<Shape> input_shapes;
  std::vector<OutputMeta> outputs;
  std::vector<SavedTensor> saved_tensors;
  Rule rule;
  int64_t sequence = 0;        // creation order: later nodes run first in backward
  bool second_order = false;   // recorded while a backward pass ran (create_graph): its rule runs in Phase::backward2

  // The i-th saved tensor (outputs re-attached to this node while grad mode is on).
  Tensor saved(size_t i);
  bool needs_input_grad(size_t i) const { return i < next.size() && next[i].node != nullptr; }
  virtual std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs);
  // Drops the saved tensors and the rule (and what the rule captured).
  virtual void release();
  virtual ~Node() = default;
};

// The node at a leaf that requires grad: adds the incoming gradient into leaf.grad.
struct AccumulateGrad : Node {
  std::weak_ptr<engine::TensorImpl> leaf;
  std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) override;
};

}  // namespace graph
