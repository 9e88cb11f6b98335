// parameter_shards.cpp: ZeRO-3's units, gathered and released around the forwards and backwards that need them.
#include "graph/parameter_shards.h"

#include <algorithm>
#include <cctype>

#include "engine/context.h"
#include "engine/error.h"
#include "engine/format.h"
#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/view.h"

namespace graph {

using engine::Category;

namespace {
// A layer of a stack: a local name whose last piece (after the last '.' or '_') is a number: "3" (a child of a
// list), "layers.3", "layer1.0", "cell_5", "reduction_cell_1".
bool is_numbered(const std::string& name) {
  const std::string last = name.substr(name.find_last_of("._") + 1);
  return !last.empty() && std::all_of(last.begin(), last.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}
std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}
// Elements [begin, end) of t flattened: a view.
Tensor flat_piece(const Tensor& t, int64_t begin, int64_t end) { return ops::slice(ops::flatten(t), 0, begin, end); }
}  // namespace

ParameterShards::ParameterShards(std::shared_ptr<engine::dist::Communicator> comm, const GradientReducer& reducer,
                                 Module& root)
    : comm_(std::move(comm)), reducer_(reducer) {
  const auto& params = reducer_.params();
  for (size_t k = 0; k < params.size(); k++) index_[params[k].second.impl()] = k;
  // How many modules hold each parameter: one held twice (tied weights) belongs to the root, which is gathered
  // whenever either holder runs.
  std::map<const engine::TensorImpl*, int> holders;
  std::vector<Module*> stack = {&root};
  while (!stack.empty()) {
    Module* m = stack.back();
    stack.pop_back();
    for (const auto& [name, p] : m->own_parameters()) holders[p.impl()]++;
    for (const auto& [name, c] : m->children()) stack.push_back(c.get());
  }
  const size_t unassigned = size_t(-1);
  unit_of_.assign(params.size(), unassigned);
  units_.push_back(Unit{});
  // Depth first in registration order: a numbered module below the root unit starts a unit of its own.
  struct Visit {
    Module* m;
    std::string path;
    size_t unit;
  };
  std::vector<Visit> visits = {{&root, "", 0}};
  while (!visits.empty()) {
    Visit v = visits.back();
    visits.pop_back();
    for (const auto& [name, p] : v.m->own_parameters()) {
      auto it = index_.find(p.impl());
      if (it == index_.end() || unit_of_[it->second] != unassigned) continue;
      unit_of_[it->second] = holders[p.impl()] > 1 ? 0 : v.unit;
    }
    const auto& children = v.m->children();
    std::vector<Visit> next;
    for (const auto& [name, c] : children) {
      size_t unit = v.unit;
      if (unit == 0 && is_numbered(name)) {
        unit = units_.size();
        units_.push_back(Unit{join(v.path, name), {}, 0, false, 0});
        unit_of_module_[c.get()] = unit;
        c->set_forward_observer(this);
        observed_.push_back(c.get());
      }
      next.push_back({c.get(), join(v.path, name), unit});
    }
    visits.insert(visits.end(), next.rbegin(), next.rend());  // reversed onto the stack: visited in order
  }
  // A parameter the tree does not hold (none should) goes to the root. (A unit whose parameters are all frozen has
  // none: gathering it does nothing.)
  for (size_t k = 0; k < params.size(); k++) {
    if (unit_of_[k] == unassigned) unit_of_[k] = 0;
    units_[unit_of_[k]].params.push_back(k);
    units_[unit_of_[k]].bytes += params[k].second.nbytes();
  }

  NoGrad no_grad;
  stored_.assign(params.size(), Tensor());
  for (const GradientReducer::Piece& piece : reducer_.pieces()) {
    if (piece.owner != comm_->rank()) continue;
    const auto& [name, p] = params[piece.param];
    // A whole parameter keeps its shape (the optimizer's update of an unsharded entry is of the whole shape).
    Tensor t =
        piece.begin == 0 && piece.end == p.numel() ? ops::clone(p) : ops::clone(flat_piece(p, piece.begin, piece.end));
    t.set_category(Category::param);
    t.storage()->set_owner(name + "/shard");
    stored_[piece.param] = t;
  }
  for (size_t k = 0; k < params.size(); k++) {
    const Tensor& p = params[k].second;
    ENGINE_CHECK(p.storage()->block.bytes == p.nbytes() && p.is_contiguous(), "--zero 3: parameter '", params[k].first,
                 "' shares its block with other tensors; ZeRO-3 frees each parameter's own block between uses, so "
                 "train this model with --zero 2");
    p.storage()->on_use = [this, u = unit_of_[k]] { gather(u); };
  }
  for (Unit& u : units_) u.gathered = true;
  release_all();
}

ParameterShards::~ParameterShards() {
  for (Module* m : observed_) m->set_forward_observer(nullptr);
  for (const auto& [name, p] : reducer_.params()) p.storage()->on_use = nullptr;
}

Tensor ParameterShards::stored(const std::string& name) const {
  const auto& params = reducer_.params();
  for (size_t k = 0; k < params.size(); k++)
    if (params[k].first == name) return stored_[k];
  return Tensor();
}

size_t ParameterShards::shard_bytes() const {
  size_t n = 0;
  for (const Tensor& t : stored_) n += t.defined() ? t.nbytes() : 0;
  return n;
}

void ParameterShards::gather(size_t unit) {
  Unit& u = units_[unit];
  if (u.gathered) return;
  NoGrad no_grad;
  engine::OpScope op("zero3_gather");
  const auto& params = reducer_.params();
  for (size_t k : u.params) params[k].second.storage()->restore();
  u.gathered = true;  // (before the copies: they read the parameters' storages)
  for (const GradientReducer::Piece& piece : reducer_.pieces()) {
    if (unit_of_[piece.param] != unit) continue;
    const Tensor view = flat_piece(params[piece.param].second, piece.begin, piece.end);
    if (piece.owner == comm_->rank()) ops::copy_(view, ops::flatten(stored_[piece.param]));
    comm_->broadcast(view, piece.owner);
  }
}

void ParameterShards::release(size_t unit) {
  Unit& u = units_[unit];
  if (!u.gathered) return;
  for (size_t k : u.params) reducer_.params()[k].second.storage()->release();
  u.gathered = false;
}

void ParameterShards::entered(const Module& m) {
  auto it = unit_of_module_.find(&m);
  if (it != unit_of_module_.end()) gather(it->second);
}

void ParameterShards::left(const Module& m) {
  const engine::Phase phase = engine::context().phase;
  if (phase == engine::Phase::backward || phase == engine::Phase::backward2 || phase == engine::Phase::recompute)
    return;  // recomputation in backward: the unit stays until its gradients are complete
  auto it = unit_of_module_.find(&m);
  if (it != unit_of_module_.end()) release(it->second);
}

void ParameterShards::gather_root() { gather(0); }

void ParameterShards::gather_all() {
  for (size_t u = 0; u < units_.size(); u++) gather(u);
}

void ParameterShards::release_all() {
  for (size_t u = 0; u < units_.size(); u++) release(u);
}

void ParameterShards::begin_backward() {
  for (Unit& u : units_) u.complete = 0;
}

void ParameterShards::gradient_complete(const engine::TensorImpl* leaf) {
  auto it = index_.find(leaf);
  if (it == index_.end()) return;
  Unit& u = units_[unit_of_[it->second]];
  if (++u.complete == u.params.size()) release(unit_of_[it->second]);
}

void ParameterShards::release_during(const std::function<void()>& backward) {
  LeafGradHookScope hook([this](const engine::TensorImpl* leaf) { gradient_complete(leaf); });
  begin_backward();
  backward();
}

}  // namespace graph
