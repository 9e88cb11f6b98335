// context.h: the tags that the allocator stamps on every block, taken from the running code's context.
//
// Each thread has one Context: the current phase (forward, backward, ...), the stack of module scopes
// ("encoder", "layer.3", "attention") and the op that is running ("softmax"). A block's owner is then
// "encoder.layer.3.attention/softmax". MemoryScope and PhaseScope are RAII guards that push and pop.
// (graph/ re-exports MemoryScope; it lives here because the owner tag is part of the memory model.)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace engine {

// recompute: a forward pass rerun inside backward (graph::recompute, activation checkpointing). backward2: the
// second-order backward, the rules of nodes that a backward pass itself recorded (create_graph: a gradient penalty
// such as StyleGAN's R1 backpropagated through the gradient it took).
enum class Phase : uint8_t { setup, forward, backward, optimizer, generate, recompute, backward2, kCount };
const char* phase_name(Phase p);

// Why a block exists (see ledger.h for the meaning of each).
enum class Category : uint8_t { param, grad, optimizer, activation, temp, workspace, input, kv_cache, comm, kCount };
constexpr int kNumCategories = int(Category::kCount);
const char* category_name(Category c);

// The module path of the running code: pieces pushed and popped by MemoryScope (a node's backward sets its forward's
// whole path as one piece), kept joined with '.' (empty pieces skipped) so that an allocation's owner is a copy of the
// path, not a join of its pieces. Every push and pop draws a new version number, unique in the process: equal versions
// mean the same path (the ledger remembers the owner it interned for a version and op).
class ScopeStack {
 public:
  void push(const std::string& piece) {
    ends_.push_back(path_.size());
    version_ = next_version();
    if (piece.empty()) return;
    if (!path_.empty()) path_ += '.';
    path_ += piece;
  }
  void pop() {
    path_.resize(ends_.back());
    ends_.pop_back();
    version_ = next_version();
  }
  const std::string& path() const { return path_; }
  uint64_t version() const { return version_; }

 private:
  std::string path_;
  std::vector<size_t> ends_;  // path_'s length before each push
  uint64_t version_ = next_version();
  static uint64_t next_version();
};

struct Context {
  Phase phase = Phase::setup;
  ScopeStack scopes;
  const char* op = nullptr;          // op running now, or nullptr
  Category category = Category::temp;  // category of new blocks (CategoryScope changes it)
};

Context& context();          // this thread's
std::string current_owner();  // "a.b.c/op", "a.b.c", "/op" or "" (nothing known)
std::string current_scope();  // "a.b.c"

class MemoryScope {
 public:
  explicit MemoryScope(const std::string& name) { context().scopes.push(name); }
  ~MemoryScope() { context().scopes.pop(); }
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;
};

class PhaseScope {
 public:
  explicit PhaseScope(Phase p) : saved_(context().phase) { context().phase = p; }
  ~PhaseScope() { context().phase = saved_; }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;
 private:
  Phase saved_;
};

// OpScope("softmax"): names the op for blocks allocated inside it. Nested ops keep the outermost name
// (a composite op's inner allocations belong to it).
class OpScope {
 public:
  explicit OpScope(const char* op) : saved_(context().op) { if (!saved_) context().op = op; }
  ~OpScope() { context().op = saved_; }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;
 private:
  const char* saved_;
};

// CategoryScope(Category::optimizer): blocks allocated inside are tagged with that category.
class CategoryScope {
 public:
  explicit CategoryScope(Category c) : saved_(context().category) { context().category = c; }
  ~CategoryScope() { context().category = saved_; }
  CategoryScope(const CategoryScope&) = delete;
  CategoryScope& operator=(const CategoryScope&) = delete;
 private:
  Category saved_;
};

}  // namespace engine
