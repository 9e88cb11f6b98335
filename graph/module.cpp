// module.cpp: the parameter tree.
#include "graph/module.h"

#include "engine/error.h"
#include "graph/autograd.h"
#include "ops/elementwise.h"

namespace graph {

namespace {
thread_local int g_parameter_dtype = -1;  // -1: no ParameterDtypeScope
}  // namespace

ParameterDtypeScope::ParameterDtypeScope(engine::DType dtype) : saved_(g_parameter_dtype) {
  g_parameter_dtype = int(dtype);
}
ParameterDtypeScope::~ParameterDtypeScope() { g_parameter_dtype = saved_; }

ModuleScope::ModuleScope(const std::string& name, const Module* module, ForwardObserver* observer)
    : scope_(name), module_(module), observer_(observer) {
  if (observer_) observer_->entered(*module_);
}

ModuleScope::~ModuleScope() {
  if (observer_) observer_->left(*module_);
}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  ENGINE_CHECK(t.defined(), "register_parameter: '", name, "' is undefined");
  if (g_parameter_dtype >= 0 && engine::is_floating(t.dtype()) && int(t.dtype()) != g_parameter_dtype) {
    NoGrad no_grad;
    engine::CategoryScope category(engine::Category::param);
    t = ops::to(t.detach(), engine::DType(g_parameter_dtype));
  }
  t.set_requires_grad(true);
  t.set_category(engine::Category::param);
  t.set_name(name);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  ENGINE_CHECK(t.defined(), "register_buffer: '", name, "' is undefined");
  t.set_category(engine::Category::param);
  t.set_name(name);
  buffers_.emplace_back(name, t);
  return t;
}

namespace {
std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}
}  // namespace

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(const std::string& prefix) const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [n, t] : params_) out.emplace_back(join(prefix, n), t);
  for (const auto& [n, c] : children_) {
    auto sub = c->named_parameters(join(prefix, n));
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(const std::string& prefix) const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [n, t] : buffers_) out.emplace_back(join(prefix, n), t);
  for (const auto& [n, c] : children_) {
    auto sub = c->named_buffers(join(prefix, n));
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::tag_memory(const std::string& prefix) const {
  for (auto& [name, t] : named_parameters(prefix)) t.storage()->set_owner(name);
  for (auto& [name, t] : named_buffers(prefix)) t.storage()->set_owner(name);
}

std::vector<std::string> Module::load(const std::map<std::string, Tensor>& tensors, bool strict,
                                      const std::vector<std::string>& ignored) {
  auto targets = named_parameters();
  auto buffers = named_buffers();
  targets.insert(targets.end(), buffers.begin(), buffers.end());
  std::vector<std::string> missing, loaded;
  for (auto& [name, t] : targets) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      missing.push_back(name);
      continue;
    }
    ENGINE_CHECK(it->second.shape() == t.shape(), "checkpoint tensor '", name, "' has shape ",
                 engine::shape_str(it->second.shape()), " but the model's parameter has shape ",
                 engine::shape_str(t.shape()));
    // A precision conversion (f16 -> f32, f32 -> bf16) is a load; a float stored as an integer is a corrupt file.
    ENGINE_CHECK(engine::is_floating(it->second.dtype()) == engine::is_floating(t.dtype()), "checkpoint tensor '", name,
                 "' is ", engine::dtype_name(it->second.dtype()), " but the model's is ", engine::dtype_name(t.dtype()),
                 ": a floating-point tensor loads only from a floating-point one (and an integer from an integer)");
    loaded.push_back(name);
  }
  auto list = [](const std::vector<std::string>& names) {
    std::string s;
    for (size_t i = 0; i < names.size() && i < 20; i++) s += (i ? ", " : "") + names[i];
    if (names.size() > 20) s += engine::str(", ... (", names.size(), " in all)");
    return s;
  };
  if (strict) {
    ENGINE_CHECK(missing.empty(), "checkpoint is missing ", missing.size(), " of the model's tensors: ", list(missing));
    std::vector<std::string> unexpected;
    for (const auto& [name, t] : tensors) {
      bool known = false;
      for (auto& [n, p] : targets) known |= n == name;
      for (const auto& i : ignored) known |= i == name;
      if (!known) unexpected.push_back(name);
    }
    ENGINE_CHECK(unexpected.empty(), "checkpoint has ", unexpected.size(),
                 " tensors the model does not have: ", list(unexpected));
  }
  // All checks passed: now copy (nothing is half-loaded on error).
  graph::NoGrad ng;
  for (auto& [name, t] : targets) {
    auto it = tensors.find(name);
    if (it != tensors.end() && it->second.impl() != t.impl()) ops::copy_(t, it->second);  // itself: nothing to do
  }
  return loaded;
}

void Module::zero_grad() {
  for (auto& [n, t] : named_parameters()) t.set_grad(Tensor());
}

}  // namespace graph
