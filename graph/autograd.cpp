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

// The owner of a block of stacked gradients once `owner`'s gradient joins a block owned by `block_owner`: their
// common module ("encoder.layer.0.attention.self.query.weight/grad" and "....key.weight/grad" give
// "encoder.layer.0.attention.self/grad"), or `owner` when the block has no gradient owner yet.
std::string stacked_grad_owner(const std::string& block_owner, const std::string& owner) {
  const size_t suffix = block_owner.size() >= 5 ? block_owner.size() - 5 : 0;
  if (block_owner.compare(suffix, std::string::npos, "/grad") != 0 || block_owner == owner) return owner;
  size_t n = 0;
  while (n < block_owner.size() && n < owner.size() && block_owner[n] == owner[n]) n++;
  const size_t dot = block_owner.rfind('.', n);  // back to a whole module name
  return dot == std::string::npos || dot == 0 ? owner : block_owner.substr(0, dot) + "/grad";
}

// g is the only reference to its block, fills it whole (contiguous, from its start) and has no history: whoever
// holds g may keep the block as its own or change it in place, and nothing else sees it (AccumulateGrad's takeover,
// pending_gradient's in-place sums).
bool owns_whole_block(const Tensor& g) {
  const auto& impl = g.impl_ptr();
  return impl.use_count() == 1 && impl->storage.use_count() == 1 && !impl->grad_fn && g.is_contiguous() &&
         g.offset() == 0 && g.nbytes() == impl->storage->block.bytes;
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
    const bool fits = g.is_contiguous() && g.dtype() == t.dtype() && g.shape() == t.shape();
    if (fits && owns_whole_block(g)) {
      impl->storage->set_category(Category::grad);
      impl->storage->set_owner(grad_owner(t));
      t.set_grad(g);
    } else if (fits && impl->storage->stacked_gradients && impl.use_count() == 1 && !impl->grad_fn) {
      // Its rows of a stack of gradients (ops::linear's stacked weights): kept as a view of the shared block, which
      // is named after the parameters' common module once a second one joins.
      const bool first = impl->storage->category() != Category::grad;
      impl->storage->set_category(Category::grad);
      impl->storage->set_owner(first ? grad_owner(t) : stacked_grad_owner(impl->storage->owner(), grad_owner(t)));
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
  const engine::Phase now = engine::context().phase;
  node->second_order = now == engine::Phase::backward || now == engine::Phase::backward2;
  for (const Tensor& in : inputs) {
    Edge e;
    if (in.defined()) in.storage()->check_live();  // (ZeRO-3; on meta no kernel read it)
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
    if (s.defined() && s.storage()->device->ledger().detail())
      s.storage()->annotate(engine::str("saved by ", name, " for its backward"));
    node->saved_tensors.push_back(std::move(st));
  }
  return node;
}

std::shared_ptr<Node> record_optional(const char* name, const std::vector<Tensor>& inputs,
                                      const std::vector<Tensor>& results, const std::vector<Tensor>& saved,
                                      Node::Rule rule) {
  std::vector<Tensor> outputs;
  std::vector<int> slot(results.size(), -1);  // the node output that holds results[k], or -1
  for (size_t k = 0; k < results.size(); k++)
    if (results[k].defined()) {
      slot[k] = int(outputs.size());
      outputs.push_back(results[k]);
    }
  return record(name, inputs, outputs, saved, [slot, rule](Node& n, const std::vector<Tensor>& h) {
    std::vector<Tensor> upstream(slot.size());
    for (size_t k = 0; k < slot.size(); k++)
      if (slot[k] >= 0) upstream[k] = h[size_t(slot[k])];
    return rule(n, upstream);
  });
}

// ---------------------------------------------------------------------------------------------------
// The backward pass

namespace {

thread_local LeafGradHook leaf_grad_hook;

// The running rule's view of its inputs' gradient buffers (pending_gradient): slot i is input i's buffer in the
// pass (or null), taken[i] set when the rule took it. Saved and restored around each rule (passes may nest).
struct PendingGradients {
  std::vector<Tensor*> slots;
  std::vector<bool> taken;
};
thread_local PendingGradients* g_pending = nullptr;

// While it lives, pending_gradient answers from `pending`; the outer rule's view comes back however the rule ends.
class PendingScope {
 public:
  explicit PendingScope(PendingGradients& pending) : outer_(g_pending) { g_pending = &pending; }
  ~PendingScope() { g_pending = outer_; }
  PendingScope(const PendingScope&) = delete;
  PendingScope& operator=(const PendingScope&) = delete;

 private:
  PendingGradients* outer_;
};

struct ByLatest {
  bool operator()(const Node* a, const Node* b) const { return a->sequence < b->sequence; }
};

// What a pass computes: backward() accumulates into the leaves' .grad; grad() captures the gradients of
// `capture` (leaves by impl, non-leaves by (node, output number)) and leaves .grad alone.
struct BackwardOptions {
  bool create_graph = false, retain_graph = false, accumulate = true;
  const std::vector<Tensor>* capture = nullptr;
};

// While a node's rule runs, the blocks it allocates are owned by the op's module, op "<name>_backward"; the
// context's scopes and op are restored however the rule ends.
class NodeContext {
 public:
  explicit NodeContext(const Node& node)
      : scopes_(std::move(engine::context().scopes)), op_(engine::context().op) {
    engine::context().scopes = engine::ScopeStack();
    engine::context().scopes.push(node.scope);
    engine::context().op = node.backward_name.c_str();
  }
  ~NodeContext() {
    engine::context().scopes = std::move(scopes_);
    engine::context().op = op_;
  }
  NodeContext(const NodeContext&) = delete;
  NodeContext& operator=(const NodeContext&) = delete;

 private:
  engine::ScopeStack scopes_;
  const char* op_;
};

// One backward pass over the graph reachable from the roots: nodes run in reverse order of creation once all
// their consumers have run (a dependency count), each node's output gradients summed in a buffer first.
class BackwardPass {
 public:
  BackwardPass(const std::vector<Tensor>& roots, const BackwardOptions& o) : roots_(roots), o_(o) {
    if (o.capture) index_captures(*o.capture);
    count_dependencies();
  }

  std::vector<Tensor> run(const std::vector<Tensor>& grad_roots) {
    seed(grad_roots);
    EnableGrad mode(o_.create_graph);
    while (!ready_.empty()) {
      Node* node = ready_.top();
      ready_.pop();
      std::vector<Tensor> grads = std::move(buffers_[node]);
      buffers_.erase(node);
      grads.resize(std::max<size_t>(node->outputs.size(), 1));
      if (auto* acc = dynamic_cast<AccumulateGrad*>(node)) reach_leaf(*acc, grads);
      else run_node(node, grads);
    }
    return std::move(captured_);
  }

 private:
  void index_captures(const std::vector<Tensor>& capture) {
    captured_.resize(capture.size());
    for (size_t i = 0; i < capture.size(); i++) {
      const Tensor& t = capture[i];
      ENGINE_CHECK(t.requires_grad(), "grad: input ", i, " does not require grad");
      if (t.grad_fn()) capture_edge_[{t.grad_fn().get(), t.impl()->output_nr}] = i;
      else capture_leaf_[t.impl()] = i;
    }
  }

  // Dependencies over the reachable graph; `keep_` holds every node alive while the pass runs.
  void count_dependencies() {
    std::vector<Node*> stack;
    for (const Tensor& r : roots_) {
      ENGINE_CHECK(r.requires_grad(), "backward: the root does not require grad (no input requires grad, "
                   "or it was computed under NoGrad)");
      if (r.grad_fn() && keep_.emplace(r.grad_fn().get(), r.grad_fn()).second) stack.push_back(r.grad_fn().get());
    }
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Edge& e : n->next) {
        if (!e.node) continue;
        dependencies_[e.node.get()]++;
        if (keep_.emplace(e.node.get(), e.node).second) {
          stack.push_back(e.node.get());
          // A leaf has one AccumulateGrad node per op that used it: its .grad is complete after the last one.
          if (leaf_grad_hook)
            if (auto* acc = dynamic_cast<AccumulateGrad*>(e.node.get()))
              if (auto leaf = acc->leaf.lock()) pending_leaf_nodes_[leaf.get()]++;
        }
      }
    }
  }

  // The roots' gradients (ones for one-element roots when none is given) go into their nodes' buffers.
  void seed(const std::vector<Tensor>& grad_roots) {
    ENGINE_CHECK(grad_roots.empty() || grad_roots.size() == roots_.size(), "backward: ", roots_.size(),
                 " roots but ", grad_roots.size(), " gradients");
    for (size_t i = 0; i < roots_.size(); i++) {
      const Tensor& r = roots_[i];
      Tensor g;
      if (grad_roots.empty() || !grad_roots[i].defined()) {
        ENGINE_CHECK(r.numel() == 1, "backward: the root has shape ", engine::shape_str(r.shape()),
                     "; give its gradient explicitly or reduce it to one element");
        g = ops::ones_like(r);
      } else {
        g = grad_roots[i];
        ENGINE_CHECK(g.shape() == r.shape(), "backward: gradient of shape ", engine::shape_str(g.shape()),
                     " for a root of shape ", engine::shape_str(r.shape()));
      }
      if (!r.grad_fn()) {  // the root is a leaf
        if (o_.capture && capture_leaf_.count(r.impl())) captured_[capture_leaf_[r.impl()]] = g;
        continue;
      }
      accumulate_into(r.grad_fn(), r.impl()->output_nr, g);
    }
    for (const Tensor& r : roots_)
      if (r.grad_fn() && dependencies_[r.grad_fn().get()] == 0) {
        dependencies_[r.grad_fn().get()] = -1;  // queued
        ready_.push(r.grad_fn().get());
      }
  }

  std::vector<Tensor>& buffer_of(Node* node) {
    auto& buf = buffers_[node];
    if (buf.size() < node->outputs.size()) buf.resize(std::max<size_t>(node->outputs.size(), 1));
    return buf;
  }

  // `in_place`: g is the buffer's own sum already (a rule took it through pending_gradient and added into it).
  void accumulate_into(const std::shared_ptr<Node>& node, int slot, const Tensor& g, bool in_place = false) {
    auto& buf = buffer_of(node.get());
    if (!g.defined()) return;
    buf[size_t(slot)] = buf[size_t(slot)].defined() && !in_place ? ops::add(buf[size_t(slot)], g) : g;
  }

  // A leaf's gradient: captured for grad(), accumulated into .grad for backward(). `grads` is handed over as
  // it is: when it holds the only reference, AccumulateGrad takes the block over instead of copying it.
  void reach_leaf(AccumulateGrad& acc, const std::vector<Tensor>& grads) {
    auto leaf = acc.leaf.lock();
    if (o_.capture && leaf && capture_leaf_.count(leaf.get())) {
      Tensor& c = captured_[capture_leaf_[leaf.get()]];
      c = c.defined() ? ops::add(c, grads[0]) : grads[0];
    } else if (o_.accumulate) {
      engine::context().op = nullptr;
      {
        engine::CategoryScope cs(Category::grad);
        acc.apply(grads);
      }
      if (leaf_grad_hook && leaf && --pending_leaf_nodes_[leaf.get()] == 0) leaf_grad_hook(leaf.get());
    }
  }

  // Runs one node's rule and passes its input gradients on; the node drops its saved tensors at once (the
  // activation memory that falls during backward) unless the graph is retained.
  void run_node(Node* node, std::vector<Tensor>& grads) {
    if (o_.capture)  // gradients flowing into non-leaf inputs of grad()
      for (size_t k = 0; k < grads.size(); k++) {
        auto it = capture_edge_.find({node, int(k)});
        if (it != capture_edge_.end()) captured_[it->second] = grads[k];
      }
    for (size_t k = 0; k < node->outputs.size(); k++)  // undefined output gradients: zeros, so rules see all
      if (!grads[k].defined()) {
        const OutputMeta& m = node->outputs[k];
        grads[k] = ops::zeros(m.shape, m.dtype, m.device);
      }
    // ZeRO-3 (graph/parameter_shards.h): a parameter the rule needs is whole again before it runs.
    for (const SavedTensor& s : node->saved_tensors)
      if (s.data.defined() && s.data.storage()->released() && s.data.storage()->on_use) s.data.storage()->on_use();
    // The inputs' buffers, for pending_gradient (none under create_graph: the sums must stay on the graph).
    PendingGradients pending;
    if (!o_.create_graph)
      for (const Edge& e : node->next) {
        pending.slots.push_back(e.node ? &buffer_of(e.node.get())[size_t(e.input_nr)] : nullptr);
        pending.taken.push_back(false);
      }
    std::vector<Tensor> input_grads;
    {
      NodeContext context(*node);
      engine::PhaseScope order(node->second_order ? engine::Phase::backward2 : engine::Phase::backward);
      PendingScope rule_view(pending);
      input_grads = node->apply(grads);
    }
    grads.clear();
    if (!o_.retain_graph) node->release();
    ENGINE_CHECK(input_grads.size() == node->next.size(), node->name, ": backward rule returned ",
                 input_grads.size(), " gradients for ", node->next.size(), " inputs");
    for (size_t i = 0; i < node->next.size(); i++) {
      const Edge& e = node->next[i];
      if (!e.node) continue;
      if (input_grads[i].defined())
        ENGINE_CHECK(input_grads[i].shape() == node->input_shapes[i], node->name, ": backward rule gave input ",
                     i, " a gradient of shape ", engine::shape_str(input_grads[i].shape()), " for shape ",
                     engine::shape_str(node->input_shapes[i]));
      const bool in_place = i < pending.taken.size() && pending.taken[i];
      ENGINE_CHECK(!in_place || (input_grads[i].defined() && input_grads[i].impl() == pending.slots[i]->impl()),
                   node->name, ": backward rule took input ", i, "'s pending gradient but returned another tensor");
      accumulate_into(e.node, e.input_nr, input_grads[i], in_place);
      if (--dependencies_[e.node.get()] == 0) ready_.push(e.node.get());
    }
  }

  const std::vector<Tensor>& roots_;
  BackwardOptions o_;
  std::map<const engine::TensorImpl*, size_t> capture_leaf_;
  std::map<std::pair<const Node*, int>, size_t> capture_edge_;
  std::vector<Tensor> captured_;
  std::unordered_map<Node*, std::vector<Tensor>> buffers_;  // gradient buffers, one slot per node output
  std::unordered_map<Node*, int> dependencies_;
  std::unordered_map<const engine::TensorImpl*, int> pending_leaf_nodes_;  // AccumulateGrad nodes yet to run
  std::unordered_map<Node*, std::shared_ptr<Node>> keep_;
  std::priority_queue<Node*, std::vector<Node*>, ByLatest> ready_;
};

std::vector<Tensor> run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
                                 const BackwardOptions& o) {
  engine::PhaseScope phase(engine::Phase::backward);
  return BackwardPass(roots, o).run(grad_roots);
}

}  // namespace

LeafGradHookScope::LeafGradHookScope(LeafGradHook hook) : saved_(std::move(leaf_grad_hook)) {
  leaf_grad_hook = std::move(hook);
}
LeafGradHookScope::~LeafGradHookScope() { leaf_grad_hook = std::move(saved_); }

Tensor pending_gradient(size_t input, engine::DType dtype) {
  if (!g_pending || input >= g_pending->slots.size() || !g_pending->slots[input]) return Tensor();
  const Tensor& g = *g_pending->slots[input];
  if (!g.defined() || g_pending->taken[input] || g.dtype() != dtype) return Tensor();
  // The only holder: no other tensor (a saved one, a capture, a second input's gradient) sees the sum change.
  if (!owns_whole_block(g)) return Tensor();
  g_pending->taken[input] = true;
  return g;
}

void backward(const Tensor& root, const Tensor& grad_root, bool create_graph, bool retain_graph) {
  backward(std::vector<Tensor>{root}, std::vector<Tensor>{grad_root}, create_graph, retain_graph);
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots, bool create_graph,
              bool retain_graph) {
  run_backward(roots, grad_roots, {create_graph, retain_graph || create_graph, true, nullptr});
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool create_graph, bool retain_graph) {
  return run_backward(outputs, grad_outputs, {create_graph, retain_graph || create_graph, false, &inputs});
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
             engine::PhaseScope ps(engine::Phase::recompute);
             struct Again {  // recomputing() is true while fn runs again, also when it throws
               Again() { ++g_recomputing; }
               ~Again() { --g_recomputing; }
             } again_scope;
             again = fn(detached);
           }
           engine::generator() = now;
           std::vector<Tensor> g_need;
           if (again.requires_grad())
             g_need = run_backward({again}, {grad_outputs[0]}, {false, false, true, &need});
           std::vector<Tensor> result(detached.size());
           for (size_t i = 0, k = 0; i < detached.size(); i++)
             if (self.needs_input_grad(i)) result[i] = g_need.empty() ? Tensor() : g_need[k++];
           return result;
         });
  return out;
}

}  // namespace graph
