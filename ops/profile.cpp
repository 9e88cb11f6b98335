// profile.cpp: per-op kernel times (see profile.h).
#include "ops/profile.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "engine/context.h"
#ifdef ENGINE_CUDA
#include "engine/cuda/runtime.h"
#endif

namespace ops {

namespace {

struct Pending {
  std::string op;
  std::string module;
  bool cuda = false;
  double host_ms = 0;  // cpu: measured at once
  std::chrono::steady_clock::time_point host_start;
#ifdef ENGINE_CUDA
  cudaEvent_t start = nullptr, stop = nullptr;
#endif
};

struct Timing {
  bool on = false;
  std::vector<Pending> pending;  // the open bracket is the last one
#ifdef ENGINE_CUDA
  cudaEvent_t step_start = nullptr;  // start_step_timing's marker (cuda), null when none is pending
#endif
};

Timing& timing() {
  static thread_local Timing t;
  return t;
}

}  // namespace

void set_kernel_timing(bool on) { timing().on = on; }
bool kernel_timing() { return timing().on; }

void begin_kernel_timing(const char* op, const engine::Tensor& like) {
  Pending p;
  p.op = engine::context().op ? engine::context().op : op;
  p.module = engine::current_scope();
  p.cuda = like.device().type() == engine::DeviceType::cuda;
#ifdef ENGINE_CUDA
  if (p.cuda) {
    ENGINE_CUDA_CHECK(cudaEventCreate(&p.start));
    ENGINE_CUDA_CHECK(cudaEventCreate(&p.stop));
    ENGINE_CUDA_CHECK(cudaEventRecord(p.start, engine::cuda::stream()));
  }
#endif
  p.host_start = std::chrono::steady_clock::now();
  timing().pending.push_back(std::move(p));
}

void end_kernel_timing() {
  Pending& p = timing().pending.back();
#ifdef ENGINE_CUDA
  if (p.cuda) {
    ENGINE_CUDA_CHECK(cudaEventRecord(p.stop, engine::cuda::stream()));
    return;
  }
#endif
  p.host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - p.host_start).count();
}

std::vector<KernelTime> take_kernel_times(std::vector<KernelTime>* by_module) {
  std::map<std::string, KernelTime> by_op;
  std::map<std::pair<std::string, std::string>, KernelTime> by_module_op;
#ifdef ENGINE_CUDA
  std::vector<cudaEvent_t> used;  // destroyed once every gap is read
  cudaEvent_t previous = timing().step_start;  // the end of the GPU's last timed work
  if (previous) used.push_back(previous);
  timing().step_start = nullptr;
#endif
  for (Pending& p : timing().pending) {
    double ms = p.host_ms, idle = 0;
#ifdef ENGINE_CUDA
    if (p.cuda) {
      float f = 0;
      ENGINE_CUDA_CHECK(cudaEventSynchronize(p.stop));
      ENGINE_CUDA_CHECK(cudaEventElapsedTime(&f, p.start, p.stop));
      ms = f;
      if (previous) {
        ENGINE_CUDA_CHECK(cudaEventElapsedTime(&f, previous, p.start));
        idle = std::max(0.0, double(f));
      }
      previous = p.stop;
      used.push_back(p.start);
      used.push_back(p.stop);
    }
#endif
    KernelTime& in_module = by_module_op[{p.module, p.op}];
    in_module.module = p.module;
    for (KernelTime* k : {&by_op[p.op], &in_module}) {
      k->op = p.op;
      k->kernels++;
      k->ms += ms;
      k->idle_ms += idle;
    }
  }
#ifdef ENGINE_CUDA
  for (cudaEvent_t e : used) ENGINE_CUDA_CHECK(cudaEventDestroy(e));
#endif
  timing().pending.clear();
  auto largest_first = [](const KernelTime& a, const KernelTime& b) { return a.ms > b.ms; };
  if (by_module) {
    by_module->clear();
    for (auto& [key, k] : by_module_op) by_module->push_back(k);
    std::sort(by_module->begin(), by_module->end(), largest_first);
  }
  std::vector<KernelTime> out;
  for (auto& [name, k] : by_op) out.push_back(k);
  std::sort(out.begin(), out.end(), largest_first);
  return out;
}

void start_step_timing(engine::Device& device) {
  take_kernel_times();
#ifdef ENGINE_CUDA
  if (device.type() == engine::DeviceType::cuda) {
    ENGINE_CUDA_CHECK(cudaEventCreate(&timing().step_start));
    ENGINE_CUDA_CHECK(cudaEventRecord(timing().step_start, engine::cuda::stream()));
  }
#else
  (void)device;
#endif
}

}  // namespace ops
