// module.cpp: the parameter tree.
#include "graph/module.h"

#include "engine/error.h"

namespace graph {

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  ENGINE_CHECK(t.defined(), "register_parameter: '", name, "' is undefined");
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

void Module::zero_grad() {
  for (auto& [n, t] : named_parameters()) t.set_grad(Tensor());
}

}  // namespace graph
