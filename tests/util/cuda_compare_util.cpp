// cuda_compare_util.cpp: cpu-vs-cuda comparisons for the CUDA tests (see cuda_compare_util.h).
#include "tests/util/cuda_compare_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>

#include "engine/rng.h"
#include "graph/autograd.h"
#include "ops/factory.h"

namespace testutil {

using engine::DType;
using engine::Shape;

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::f64: return {1e-12, 1e-10};
    case DType::f32: return {1e-5, 1e-5};
    case DType::f16: return {1e-3, 2e-3};
    case DType::bf16: return {1e-2, 1e-2};
    default: return {0, 0};
  }
}

std::shared_ptr<engine::Device> cuda_device() {
  static std::shared_ptr<engine::Device> device = engine::Device::create(engine::DeviceType::cuda, size_t(8) << 30);
  return device;
}

namespace {
// A cpu device for copies back: the default one when it is a cpu device, else one of our own.
std::shared_ptr<engine::Device> host_device() {
  if (engine::default_device()->type() == engine::DeviceType::cpu) return engine::default_device();
  static std::shared_ptr<engine::Device> cpu = engine::Device::create(engine::DeviceType::cpu, size_t(16) << 30);
  return cpu;
}

Tensor copy_to(const Tensor& t, const std::shared_ptr<engine::Device>& device) {
  if (!t.defined()) return t;
  Tensor out = ops::to_device(t, device);
  if (t.requires_grad()) out.set_requires_grad(true);
  return out;
}

// "[1, 0, 3]": the multi-index of flat (row-major) element i.
std::string index_str(const Shape& shape, int64_t i) {
  Shape idx(shape.size());
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; d--) {
    idx[size_t(d)] = shape[size_t(d)] ? i % shape[size_t(d)] : 0;
    i = shape[size_t(d)] ? i / shape[size_t(d)] : 0;
  }
  return engine::shape_str(idx);
}

bool same_kind(const std::string& what, const Tensor& cpu, const Tensor& other) {
  if (!cpu.defined() || !other.defined()) {
    ADD_FAILURE() << what << ": " << (cpu.defined() ? "cuda" : "cpu") << " result is undefined, the other is not";
    return false;
  }
  if (cpu.dtype() != other.dtype() || cpu.shape() != other.shape()) {
    ADD_FAILURE() << what << ": cpu gives " << describe(cpu) << ", cuda gives " << describe(other);
    return false;
  }
  return true;
}

// Weights for the output gradients: uniform in [0.5, 1.5) from a host generator (the engine's generator is
// left alone, so both runs see the same random state).
Tensor output_weight(const Tensor& y, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.5, 1.5);
  std::vector<double> v(size_t(y.numel()));
  for (double& e : v) e = u(rng);
  return ops::from_vector(v, y.shape(), y.dtype(), host_device());
}

// d(outputs)/d(inputs that require grad), weighted by `weights` (one per output; outputs that do not
// require grad are skipped).
std::vector<Tensor> grads_of(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                             const std::vector<Tensor>& weights) {
  std::vector<Tensor> need, outs, gouts;
  for (const Tensor& x : inputs)
    if (x.defined() && x.requires_grad()) need.push_back(x);
  for (size_t k = 0; k < outputs.size(); k++) {
    if (!outputs[k].defined() || !outputs[k].requires_grad()) continue;
    outs.push_back(outputs[k]);
    gouts.push_back(weights[k]);
  }
  if (need.empty() || outs.empty()) return {};
  return graph::grad(outs, need, gouts);
}
}  // namespace

Tensor to_cuda(const Tensor& t) { return copy_to(t, cuda_device()); }
Tensor to_cpu(const Tensor& t) { return copy_to(t, host_device()); }

Tensor cpu_input(const Shape& shape, DType dtype, double low, double high, bool requires_grad) {
  Tensor t = engine::is_floating(dtype) ? ops::rand(shape, low, high, dtype, host_device())
                                        : ops::randint(shape, int64_t(high), dtype, host_device());
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return engine::str(engine::dtype_name(t.dtype()), " ", engine::shape_str(t.shape()));
}

bool expect_close(const std::string& what, const Tensor& cpu, const Tensor& other, Tolerance tol) {
  if (!same_kind(what, cpu, other)) return false;
  if (tol.atol < 0) tol = tolerance_for(cpu.dtype());
  std::vector<double> a = cpu.to_double(), b = other.to_double();
  int64_t bad = 0, worst = -1;
  double worst_excess = 0, max_abs = 0;
  for (size_t i = 0; i < a.size(); i++) {
    if (a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))) continue;
    double err = std::fabs(a[i] - b[i]);
    if (std::isnan(err)) err = INFINITY;  // NaN on one side only, or inf against a number
    max_abs = std::max(max_abs, err);
    double excess = err / (tol.atol + tol.rtol * std::fabs(a[i]));
    if (excess > 1) bad++;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = int64_t(i);
    }
  }
  if (bad == 0) return true;
  ADD_FAILURE() << what << " (" << describe(cpu) << "): " << bad << " of " << a.size()
                << " elements differ beyond atol " << tol.atol << " + rtol " << tol.rtol << " * |cpu|; max abs error "
                << max_abs << "; worst at " << index_str(cpu.shape(), worst) << ": cpu " << a[size_t(worst)]
                << ", cuda " << b[size_t(worst)];
  return false;
}

bool expect_equal(const std::string& what, const Tensor& cpu, const Tensor& other) {
  if (!same_kind(what, cpu, other)) return false;
  std::vector<double> a = cpu.to_double(), b = other.to_double();
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < a.size(); i++) {
    if (a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))) continue;
    if (bad++ == 0) first = int64_t(i);
  }
  if (bad == 0) return true;
  ADD_FAILURE() << what << " (" << describe(cpu) << "): " << bad << " of " << a.size()
                << " elements differ (exact comparison); first at " << index_str(cpu.shape(), first) << ": cpu "
                << a[size_t(first)] << ", cuda " << b[size_t(first)];
  return false;
}

void expect_cuda_matches_cpu(const std::string& what, const Fn& fn, const std::vector<Tensor>& cpu_inputs,
                             Tolerance tol) {
  expect_cuda_matches_cpu_multi(
      what, [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in)}; }, cpu_inputs, tol);
}

void expect_cuda_matches_cpu_multi(const std::string& what, const MultiFn& fn, const std::vector<Tensor>& cpu_inputs,
                                   Tolerance tol) {
  const engine::Generator at_start = engine::generator();
  std::vector<Tensor> cpu_out = fn(cpu_inputs);
  // The same output gradients for both runs.
  std::vector<Tensor> w_cpu(cpu_out.size()), w_cuda(cpu_out.size());
  for (size_t k = 0; k < cpu_out.size(); k++) {
    if (!cpu_out[k].defined() || !cpu_out[k].requires_grad()) continue;
    w_cpu[k] = output_weight(cpu_out[k], uint32_t(1234 + k));
    w_cuda[k] = to_cuda(w_cpu[k]);
  }
  std::vector<Tensor> cpu_grads = grads_of(cpu_inputs, cpu_out, w_cpu);
  const engine::Generator after_cpu = engine::generator();

  engine::generator() = at_start;
  std::vector<Tensor> cuda_inputs, cuda_out, cuda_grads;
  for (const Tensor& x : cpu_inputs) cuda_inputs.push_back(to_cuda(x));
  {
    engine::DeviceGuard guard(cuda_device());
    cuda_out = fn(cuda_inputs);
    cuda_grads = grads_of(cuda_inputs, cuda_out, w_cuda);
  }
  EXPECT_EQ(engine::generator().offset, after_cpu.offset)
      << what << ": the cuda run reserved other random numbers than the cpu run";

  ASSERT_EQ(cpu_out.size(), cuda_out.size()) << what << ": number of outputs";
  for (size_t k = 0; k < cpu_out.size(); k++) {
    std::string name = engine::str(what, ": output ", k);
    if (cpu_out[k].defined() && !engine::is_floating(cpu_out[k].dtype())) expect_equal(name, cpu_out[k], cuda_out[k]);
    else expect_close(name, cpu_out[k], cuda_out[k], tol);
  }
  ASSERT_EQ(cpu_grads.size(), cuda_grads.size()) << what << ": number of gradients";
  for (size_t k = 0, j = 0; k < cpu_inputs.size(); k++) {
    if (!cpu_inputs[k].defined() || !cpu_inputs[k].requires_grad()) continue;
    const Tensor& gc = cpu_grads[j];
    const Tensor& gg = cuda_grads[j++];
    if (!gc.defined() && !gg.defined()) continue;
    expect_close(engine::str(what, ": gradient of input ", k), gc, gg, tol);
  }
}

void expect_cuda_throws(const std::string& what, const std::function<void()>& fn, const std::string& text) {
  engine::DeviceGuard guard(cuda_device());
  try {
    fn();
    cuda_device()->synchronize();
    ADD_FAILURE() << what << ": did not throw on cuda";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << what << ": " << e.what();
  }
  EXPECT_NO_THROW(cuda_device()->synchronize()) << what << ": reported again";
}

void expect_cuda_ledger_matches_meta(const std::function<void()>& program) {
  constexpr size_t kCapacity = size_t(1) << 30;
  const engine::Generator at_start = engine::generator();
  std::string csv[2];
  int k = 0;
  for (auto type : {engine::DeviceType::cuda, engine::DeviceType::meta}) {
    engine::generator() = at_start;
    auto device = engine::Device::create(type, kCapacity);
    {
      engine::DeviceGuard guard(device);
      program();
    }
    device->synchronize();
    csv[k++] = device->ledger().events_csv();
  }
  if (csv[0] == csv[1]) return;
  std::istringstream a(csv[0]), b(csv[1]);
  std::string la, lb;
  int line = 0;
  while (true) {
    bool ga = bool(std::getline(a, la)), gb = bool(std::getline(b, lb));
    line++;
    if (!ga || !gb || la != lb) {
      ADD_FAILURE() << "ledger events differ between cuda and meta at line " << line << ":\n  cuda: "
                    << (ga ? la : "(end)") << "\n  meta: " << (gb ? lb : "(end)");
      return;
    }
  }
}

double measure_bandwidth(const std::string& what, double bytes, const std::function<void()>& fn) {
  auto device = cuda_device();
  engine::DeviceGuard guard(device);
  for (int i = 0; i < 3; i++) fn();  // warm-up
  device->synchronize();
  std::vector<double> seconds;
  for (int rep = 0; rep < 7; rep++) {
    constexpr int kCalls = 10;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; i++) fn();
    device->synchronize();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kCalls);
  }
  std::sort(seconds.begin(), seconds.end());
  const double gbps = bytes / seconds[seconds.size() / 2] / 1e9;
  std::printf("  %-48s %8.1f us %8.1f GB/s\n", what.c_str(), seconds[seconds.size() / 2] * 1e6, gbps);
  return gbps;
}

double median_ms(const std::function<void()>& fn, int reps) {
  engine::DeviceGuard guard(testutil::cuda_device());
  fn();
  testutil::cuda_device()->synchronize();
  std::vector<double> ms;
  for (int i = 0; i < reps; i++) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    testutil::cuda_device()->synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double median_ms_per_call(const std::function<void()>& fn, int calls, int reps) {
  return median_ms(
             [&] {
               for (int i = 0; i < calls; i++) fn();
             },
             reps) /
         calls;
}

}  // namespace testutil
