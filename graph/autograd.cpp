// autograd.cpp: recording nodes and the backward pass.
#include "graph/autograd.h"

#include <map>
#include <queue>
#include <unordered_map>

#include "engine/context.h"
#include "engine/error.h"
#include "engine/rng.h"
#include "ops/elementwise.h"
#include "ops/factory.h"

namespace graph {

using engine::Category;
using engine::CategoryScope;
using engine::Error;
using engine::str;

namespace {
thread_local bool g_grad_enabled = true;
thread_local int64_t g_node_sequence = 0;
thread_local int g_recomputing = 0;  // nesting depth of recompute's second runs
}  // namespace

bool grad_enabled() { return g_grad_enabled; }
bool recomputing() { return g_recomputing > 0; }
void set_grad_enabled(bool on) { g_grad_enabled = on; }

bool any_requires_grad(std::initializer_list<Tensor> tensors) {
  if (!g_grad_enabled) return false;
  for (const Tensor& t : tensors)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

bool any_requires_grad(const std::vector<Tensor>& tensors) {
  if (!g_grad_enabled) return false;
  for (const Tensor& t : tensors)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

// ---------------------------------------------------------------------------------------------------
// Node

Tensor Node::saved(size_t i) {
  ENGINE_CHECK(i < saved_tensors.size(), name, ": saved tensor ", i, " does not exist (", saved_tensors.size(),
               " saved); was the graph already released by an earlier backward? pass retain_graph");
  const SavedTensor& s = saved_tensors[i];
  if (!s.defined) return Tensor();
  ENGINE_CHECK(s.data.defined(), name, ": saved tensor ", i, " was released by an earlier backward; "
               "pass retain_graph=true to run backward twice");
  if (!s.is_output || !grad_enabled()) return s.data;
  Tensor t = s.data.detach();
  t.impl()->requires_grad = true;
  t.impl()->grad_fn = shared_from_this();
  t.impl()->output_nr = s.output_nr;
  return t;
}

std::vector<Tensor> Node::apply(const std::vector<Tensor>& grad_outputs) {
  ENGINE_CHECK(rule, name, ": backward called twice on the same graph; pass retain_graph=true to the first");
  return rule(*this, grad_outputs);
}

void Node::release() {
  saved_tensors.clear();
  rule = nullptr;
}

namespace {
// A leaf's gradient is owned by "<the leaf's owner scope>/grad": for a parameter, its dotted name (tag_memory),
// so the ledger's module tables show each gradient beside its parameter. A leaf without an owner (an input
// of a gradient check) leaves the context's owner.
std::string grad_owner(const Tensor& leaf) {
  const std::string& o = leaf.storage()->owner();
  const std::string scope = o.substr(0, o.find('/'));
  return scope.empty() ? engine::current_owner() : scope + "/grad";
}
}  // namespace

std::vector<Tensor> AccumulateGrad::apply(const std::vector<Tensor>& grad_outputs) {
  auto impl = leaf.lock();
  const Tensor& g = grad_outputs[0];
  if (!impl || !g.defined()) return {};
  Tensor t(impl);
  Tensor old = t.grad();
  if (grad_enabled()) {  // create_graph: keep the gradient's history
    t.set_grad(old.defined() ? ops::add(old, g) : g);
    return {};
  }
  if (!old.defined()) {
    // The leaf owns its own gradient buffer, tagged `grad`. When nothing else holds the incoming gradient and
    // it fills a block of its own (PyTorch's AccumulateGrad "steals" it on the same condition), that block
    // becomes the leaf's: retagged and renamed exactly as a copy would be, without the copy (one launch and
    // one transient buffer per parameter and step).
    const auto& impl = g.impl_ptr();
    const bool sole = impl.use_count() == 1 && impl->storage.use_count() == 1 && !impl->grad_fn;
    if (sole && g.is_contiguous() && g.offset() == 0 && g.nbytes() == impl->storage->block.bytes &&
        g.dtype() == t.dtype() && g.shape() == t.shape()) {
      impl->storage->set_category(Category::grad);
      impl->storage->set_owner(grad_owner(t));
      t.set_grad(g);
    } else {
      CategoryScope cs(Category::grad);
      t.set_grad(ops::clone(g));
      t.grad().storage()->set_owner(grad_owner(t));
    }
  } else {
    ops::add_(old, g);
  }
  return {};
}

// ---------------------------------------------------------------------------------------------------
// Recording

std::shared_ptr<Node> record(const char* name, const std::vector<Tensor>& inputs,
                             const std::vector<Tensor>& outputs, const std::vector<Tensor>& saved,
                             Node::Rule rule) {
  auto node = std::make_shared<Node>();
  node->name = name;
  node->backward_name = std::string(name) + "_backward";
  node->scope = engine::current_scope();
  node->rule = std::move(rule);
  node->sequence = ++g_node_sequence;
  for (const Tensor& in : inputs) {
    Edge e;
    if (in.defined() && in.requires_grad()) {
      if (in.grad_fn()) {
        e.node = in.grad_fn();
        e.input_nr = in.impl()->output_nr;
      } else {
        auto acc = std::make_shared<AccumulateGrad>();
        acc->name = "accumulate_grad";
        acc->backward_name = "accumulate_grad";
        acc->leaf = in.impl_ptr();
        acc->outputs.push_back({in.shape(), in.dtype(), in.device_ptr()});
        acc->sequence = node->sequence;  // runs when reached; order among leaves does not matter
        e.node = acc;
      }
    }
    node->next.push_back(e);
    node->input_shapes.push_back(in.defined() ? in.shape() : Shape{});
  }
  for (size_t k = 0; k < outputs.size(); k++) {
    const Tensor& out = outputs[k];
    node->outputs.push_back({out.shape(), out.dtype(), out.device_ptr()});
    out.impl()->requires_grad = true;
    out.impl()->grad_fn = node;
    out.impl()->output_nr = int(k);
  }
  for (const Tensor& s : saved) {
    SavedTensor st;
    st.defined = s.defined();
    int out_nr = -1;
    for (size_t k = 0; k < outputs.size(); k++)
      if (outputs[k].impl() == s.impl()) out_nr = int(k);
    if (out_nr >= 0) {
      st.data = s.detach();
      st.is_output = true;
      st.output_nr = out_nr;
    } else {
      st.data = s;
    }
    // A block that lives on because backward needs it is an activation (unless it is a parameter,
    // an input batch or anything else with its own category).
    if (s.defined() && s.storage()->category() == Category::temp) s.set_category(Category::activation);
    node->saved_tensors.push_back(std::move(st));
  }
  return node;
}

// ---------------------------------------------------------------------------------------------------
// The backward pass

namespace {

struct ByLatest {
  bool operator()(const Node* a, const Node* b) const { return a->sequence < b->sequence; }
};

// Gradients are captured (instead of accumulated) for `capture` inputs: leaves by impl, non-leaves by
// (node, output number).
std::vector<Tensor> run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots_in,
                                 bool create_graph, bool retain_graph, const std::vector<Tensor>* capture,
                                 bool accumulate) {
  engine::PhaseScope phase(engine::Phase::backward);
  ENGINE_CHECK(grad_roots_in.empty() || grad_roots_in.size() == roots.size(),
               "backward: ", roots.size(), " roots but ", grad_roots_in.size(), " gradients");

  std::map<const engine::TensorImpl*, size_t> capture_leaf;
  std::map<std::pair<const Node*, int>, size_t> capture_edge;
  std::vector<Tensor> captured(capture ? capture->size() : 0);
  if (capture)
    for (size_t i = 0; i < capture->size(); i++) {
      const Tensor& t = (*capture)[i];
      ENGINE_CHECK(t.requires_grad(), "grad: input ", i, " does not require grad");
      if (t.grad_fn()) capture_edge[{t.grad_fn().get(), t.impl()->output_nr}] = i;
      else capture_leaf[t.impl()] = i;
    }

  // Gradient buffers, one slot per node output.
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::unordered_map<Node*, int> dependencies;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep;  // nodes alive while we run

  auto accumulate_into = [&](const std::shared_ptr<Node>& node, int slot, const Tensor& g) {
    auto& buf = buffers[node.get()];
    if (buf.size() < node->outputs.size()) buf.resize(std::max<size_t>(node->outputs.size(), 1));
    if (!g.defined()) return;
    buf[slot] = buf[slot].defined() ? ops::add(buf[slot], g) : g;
  };

  // Count dependencies over the reachable graph.
  std::vector<Node*> stack;
  for (const Tensor& r : roots) {
    ENGINE_CHECK(r.requires_grad(), "backward: the root does not require grad (no input requires grad, "
                 "or it was computed under NoGrad)");
    if (r.grad_fn() && !keep.count(r.grad_fn().get())) {
      keep[r.grad_fn().get()] = r.grad_fn();
      stack.push_back(r.grad_fn().get());
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next) {
      if (!e.node) continue;
      dependencies[e.node.get()]++;
      if (!keep.count(e.node.get())) {
        keep[e.node.get()] = e.node;
        stack.push_back(e.node.get());
      }
    }
  }

  std::priority_queue<Node*, std::vector<Node*>, ByLatest> ready;
  for (size_t i = 0; i < roots.size(); i++) {
    const Tensor& r = roots[i];
    Tensor g;
    if (grad_roots_in.empty() || !grad_roots_in[i].defined()) {
      ENGINE_CHECK(r.numel() == 1, "backward: the root has shape ", engine::shape_str(r.shape()),
                   "; give its gradient explicitly or reduce it to one element");
      g = ops::ones_like(r);
    } else {
      g = grad_roots_in[i];
      ENGINE_CHECK(g.shape() == r.shape(), "backward: gradient of shape ", engine::shape_str(g.shape()),
                   " for a root of shape ", engine::shape_str(r.shape()));
    }
    if (!r.grad_fn()) {  // the root is a leaf
      if (capture && capture_leaf.count(r.impl())) captured[capture_leaf[r.impl()]] = g;
      continue;
    }
    accumulate_into(r.grad_fn(), r.impl()->output_nr, g);
  }
  for (const Tensor& r : roots)
    if (r.grad_fn() && dependencies[r.grad_fn().get()] == 0) {
      dependencies[r.grad_fn().get()] = -1;  // queued
      ready.push(r.grad_fn().get());
    }

  EnableGrad mode(create_graph);
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(buffers[node]);
    buffers.erase(node);
    grads.resize(std::max<size_t>(node->outputs.size(), 1));

    auto* acc = dynamic_cast<AccumulateGrad*>(node);
    if (acc) {
      auto leaf = acc->leaf.lock();
      if (capture && leaf && capture_leaf.count(leaf.get())) {
        Tensor& c = captured[capture_leaf[leaf.get()]];
        c = c.defined() ? ops::add(c, grads[0]) : grads[0];
      } else if (accumulate) {
        engine::context().op = nullptr;
        engine::CategoryScope cs(Category::grad);
        acc->apply(grads);
      }
      continue;
    }
    // Capture gradients flowing into non-leaf inputs of grad().
    if (capture)
      for (size_t k = 0; k < grads.size(); k++) {
        auto it = capture_edge.find({node, int(k)});
        if (it != capture_edge.end()) captured[it->second] = grads[k];
      }
    // Undefined output gradients become zeros so every rule sees full inputs.
    for (size_t k = 0; k < node->outputs.size(); k++)
      if (!grads[k].defined()) {
        const OutputMeta& m = node->outputs[k];
        grads[k] = ops::zeros(m.shape, m.dtype, m.device);
      }

    std::vector<Tensor> input_grads;
    {
      // Blocks the rule allocates are owned by the op's module, op "<name>_backward".
      auto saved_scopes = std::move(engine::context().scopes);
      engine::context().scopes = {node->scope};
      const char* saved_op = engine::context().op;
      engine::context().op = node->backward_name.c_str();
      try {
        input_grads = node->apply(grads);
      } catch (...) {
        engine::context().scopes = std::move(saved_scopes);
        engine::context().op = saved_op;
        throw;
      }
      engine::context().scopes = std::move(saved_scopes);
      engine::context().op = saved_op;
    }
    grads.clear();
    if (!retain_graph) node->release();
    ENGINE_CHECK(input_grads.size() == node->next.size(), node->name, ": backward rule returned ",
                 input_grads.size(), " gradients for ", node->next.size(), " inputs");
    for (size_t i = 0; i < node->next.size(); i++) {
      const Edge& e = node->next[i];
      if (!e.node) continue;
      if (input_grads[i].defined())
        ENGINE_CHECK(input_grads[i].shape() == node->input_shapes[i], node->name, ": backward rule gave input ",
                     i, " a gradient of shape ", engine::shape_str(input_grads[i].shape()), " for shape ",
                     engine::shape_str(node->input_shapes[i]));
      accumulate_into(e.node, e.input_nr, input_grads[i]);
      if (--dependencies[e.node.get()] == 0) ready.push(e.node.get());
    }
  }
  return captured;
}

}  // namespace

void backward(const Tensor& root, const Tensor& grad_root, bool create_graph, bool retain_graph) {
  backward(std::vector<Tensor>{root}, std::vector<Tensor>{grad_root}, create_graph, retain_graph);
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots, bool create_graph,
              bool retain_graph) {
  run_backward(roots, grad_roots, create_graph, retain_graph || create_graph, nullptr, true);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool create_graph, bool retain_graph) {
  return run_backward(outputs, grad_outputs, create_graph, retain_graph || create_graph, &inputs, false);
}

// ---------------------------------------------------------------------------------------------------
// Recompute (activation checkpointing)

Tensor recompute(const RecomputeFn& fn, const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return fn(inputs);
  engine::Generator rng_at_forward = engine::generator();
  Tensor out;
  {
    NoGrad ng;
    out = fn(inputs);
  }
  if (!grad_enabled()) return out;
  // The node saves only fn's inputs; fn runs again in backward, then its own small graph is walked.
  record("recompute", inputs, {out}, inputs,
         [fn, rng_at_forward](Node& self, const std::vector<Tensor>& grad_outputs) {
           ENGINE_CHECK(!grad_enabled(), "recompute: double backward through a recomputed region is not "
                        "supported; run without --recompute");
           std::vector<Tensor> detached;
           std::vector<Tensor> need;
           for (size_t i = 0; i < self.saved_tensors.size(); i++) {
             Tensor in = self.saved(i);
             Tensor d = in.defined() ? in.detach() : Tensor();
             if (self.needs_input_grad(i)) {
               d.set_requires_grad(true);
               need.push_back(d);
             }
             detached.push_back(d);
           }
           engine::Generator now = engine::generator();
           engine::generator() = rng_at_forward;  // same dropout masks as the forward pass
           Tensor again;
           {
             EnableGrad eg(true);
             engine::PhaseScope ps(engine::Phase::forward);
             struct Again {  // recomputing() is true while fn runs again, also when it throws
               Again() { ++g_recomputing; }
               ~Again() { --g_recomputing; }
             } again_scope;
             again = fn(detached);
           }
           engine::generator() = now;
           std::vector<Tensor> g_need;
           if (again.requires_grad())
             g_need = run_backward({again}, {grad_outputs[0]}, false, false, &need, true);
           std::vector<Tensor> result(detached.size());
           for (size_t i = 0, k = 0; i < detached.size(); i++)
             if (self.needs_input_grad(i)) result[i] = g_need.empty() ? Tensor() : g_need[k++];
           return result;
         });
  return out;
}

}  // namespace graph
