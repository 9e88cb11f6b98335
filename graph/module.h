// module.h: Module (a tree of named parameters and children) and the scopes models use.
//
// Names are dotted paths ("encoder.layer.0.attention.self.query.weight") and are the checkpoint keys, so
// a Hugging Face safetensors file loads by name. A module's forward is its own method (no fixed
// signature); it opens `auto s = scope();` so every block it allocates is owned by its path.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/context.h"
#include "engine/tensor.h"

namespace graph {

using engine::MemoryScope;
using engine::Tensor;

// While one is alive (on this thread), Module::register_parameter casts every new floating parameter to `dtype`
// at once, so a model built for bf16/fp16 inference never holds all its f32 weights: the setup's peak is the
// low-precision weights plus one f32 tensor (models::create_model opens one for ModelConfig::inference).
class ParameterDtypeScope {
 public:
  explicit ParameterDtypeScope(engine::DType dtype);
  ~ParameterDtypeScope();
  ParameterDtypeScope(const ParameterDtypeScope&) = delete;
  ParameterDtypeScope& operator=(const ParameterDtypeScope&) = delete;

 private:
  int saved_;  // the previous scope's dtype, -1 for none
};

class Module;

// ZeRO-3 (graph/parameter_shards.h) watches the forwards of the modules it shards by: a module's forward scope
// (Module::scope) tells it when one begins and ends.
class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  virtual void entered(const Module& m) = 0;
  virtual void left(const Module& m) = 0;
};

// What Module::scope returns: the module's memory scope, and its observer told of the forward's beginning and end.
class ModuleScope {
 public:
  ModuleScope(const std::string& name, const Module* module, ForwardObserver* observer);
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

 private:
  MemoryScope scope_;
  const Module* module_;
  ForwardObserver* observer_;
};

class Module {
 public:
  virtual ~Module() = default;

  // Registers a parameter: it requires grad and its block is tagged `param`. Under a ParameterDtypeScope a
  // floating parameter is first cast to the scope's dtype (the tensor it was initialized in is freed).
  Tensor register_parameter(const std::string& name, Tensor t);
  // Registers state that is saved in checkpoints but not trained (e.g. running statistics).
  Tensor register_buffer(const std::string& name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    m->local_name_ = name;
    children_.emplace_back(name, m);
    return m;
  }

  // All parameters (or buffers) below this module, with dotted names, in registration order.
  std::vector<std::pair<std::string, Tensor>> named_parameters(const std::string& prefix = "") const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(const std::string& prefix = "") const;
  std::vector<Tensor> parameters() const;
  int64_t num_parameters() const;

  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }
  // Names every parameter's and buffer's block in the ledger by its dotted path (a module does not know
  // its path while it is being built). A model calls this on its root once it is built.
  void tag_memory(const std::string& prefix = "") const;
  // Drops every parameter's gradient (its memory goes back to the arena).
  void zero_grad();

  // Copies `tensors` into this module's parameters and buffers by dotted name (dtype converted). Every
  // tensor must match its parameter's shape, or an Error names it and both shapes. strict: every
  // parameter and buffer must be present (an Error lists the missing ones) and every tensor used (an Error
  // lists the unexpected ones, except names in `ignored`, e.g. tied copies a checkpoint also stores).
  // Returns the names that were loaded.
  std::vector<std::string> load(const std::map<std::string, Tensor>& tensors, bool strict = true,
                                const std::vector<std::string>& ignored = {});

  // The memory scope of this module's forward (its local name; nesting joins them with dots). Every forward opens
  // it before it reads a parameter: ZeRO-3 gathers the module's parameters there (set_forward_observer).
  ModuleScope scope() const { return ModuleScope(local_name_, this, observer_); }
  // The direct children, in registration order, and the name each was registered under.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }
  // The parameters this module registered itself (not its children's), in registration order.
  const std::vector<std::pair<std::string, Tensor>>& own_parameters() const { return params_; }
  // From now on this module's scope() tells `observer` (null: nobody) when its forward begins and ends.
  void set_forward_observer(ForwardObserver* observer) { observer_ = observer; }

 private:
  std::vector<std::pair<std::string, Tensor>> params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::string local_name_;
  bool training_ = true;
  ForwardObserver* observer_ = nullptr;
};

}  // namespace graph
