// cuda_device.cpp: the cuda device: one cudaMalloc arena, one stream, one cuBLASLt handle.
//
// At creation the CUDA context and cuBLASLt are initialized first, then cudaMemGetInfo tells how much the
// context and libraries took ("outside arena", reported) and how much is free. A rank of a cuda world joins NCCL
// before its device is made (tools/engine_train.cpp), so NCCL's buffers are counted there too. The arena is then one
// cudaMalloc of `capacity` bytes (0: all free memory but a reserve for what libraries allocate lazily).
// No other cudaMalloc happens anywhere: library workspaces are carved from the arena.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "engine/cuda/runtime.h"
#include "engine/device.h"
#include "engine/format.h"

namespace engine::cuda {

namespace {
cudaStream_t g_stream = nullptr;
cublasLtHandle_t g_cublaslt = nullptr;
int g_sms = 0;
int g_cc = 0;  // compute capability, major * 10 + minor
}  // namespace

void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  throw Error(str("CUDA error in ", what, " at ", file, ":", line, ": ", cudaGetErrorName(e), " (",
                  cudaGetErrorString(e), ")"));
}

void check(cublasStatus_t s, const char* what, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw Error(str("cuBLASLt error in ", what, " at ", file, ":", line, ": status ", int(s)));
}

namespace {
std::vector<std::pair<std::string, size_t>>& noted_outside() {
  static std::vector<std::pair<std::string, size_t>> noted;
  return noted;
}
}  // namespace

void note_outside_arena(const char* what, size_t bytes) {
  if (!g_stream) noted_outside().emplace_back(what, bytes);  // (a device made already has measured its report)
}

int select_rank_gpu() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  ENGINE_CHECK(e == cudaSuccess && count > 0, "device cuda: no CUDA GPU is visible (", cudaGetErrorString(e),
               "); use --device cpu, or --device meta to predict a GPU's memory without one");
  int ordinal = 0;
  if (const char* local = std::getenv("LOCAL_RANK"); local && *local && std::getenv("WORLD_SIZE"))
    ordinal = int(std::strtol(local, nullptr, 10) % count);
  if (ordinal < 0) ordinal = 0;
  ENGINE_CUDA_CHECK(cudaSetDevice(ordinal));
  return ordinal;
}

cudaStream_t stream() { return g_stream; }
cublasLtHandle_t cublaslt() { return g_cublaslt; }
// A kernel's choice may be asked before any device is made (a test run on its own): then the current GPU answers.
namespace {
void query_properties() {
  int ordinal = 0, major = 0, minor = 0, sms = 0;
  if (g_cc != 0 || cudaGetDevice(&ordinal) != cudaSuccess) return;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal) != cudaSuccess)
    return;
  g_cc = major * 10 + minor;
  g_sms = sms;
}
}  // namespace

int multiprocessors() {
  query_properties();
  return g_sms;
}
int compute_capability() {
  query_properties();
  return g_cc;
}

namespace {
std::vector<void (*)()>& sync_checks() {
  static std::vector<void (*)()> checks;
  return checks;
}
}  // namespace

void on_synchronized(void (*check)()) {
  for (auto* c : sync_checks())
    if (c == check) return;
  sync_checks().push_back(check);
}

void synchronize_and_check() {
  ENGINE_CUDA_CHECK(cudaStreamSynchronize(g_stream));
  for (auto* c : sync_checks()) c();
}

namespace {

// Memory that libraries may still allocate after the arena is taken (cuBLASLt's lazily loaded kernels,
// the CUDA runtime's own pools): left free when the capacity is chosen automatically.
constexpr size_t kLibraryReserve = size_t(512) << 20;

class CudaDevice : public Device {
 public:
  CudaDevice(size_t capacity, void* base, size_t outside, std::string product,
             std::vector<std::pair<std::string, size_t>> stages)
      : Device(DeviceType::cuda, capacity, base), product_(std::move(product)) {
    outside_arena_ = outside;
    outside_stages_ = std::move(stages);
  }
  std::string product() const override { return product_; }
  ~CudaDevice() override {
    synchronize_quietly();
    for (auto& [seq, event] : pending_) cudaEventDestroy(event);
    if (clock_origin_) cudaEventDestroy(clock_origin_);
    if (staged_) cudaEventDestroy(staged_);
    if (staging_) cudaFreeHost(staging_);
    if (base_) cudaFree(base_);
  }
  // A copy of up to kStagingBytes goes through the pinned staging ring and returns without waiting for the GPU:
  // src is copied into the ring on the host, and the ring's copy to the arena is queued on the engine's stream, in
  // order after every kernel queued before it (so after the last use of the destination's previous tenant). A
  // step's batch is thus uploaded without a synchronization per tensor. The ring's space is reused only after the
  // copies that read it are done (staged_, recorded after each, waited on when the ring wraps). Larger copies
  // (weights from a checkpoint) wait for their own completion, src being the caller's.
  void copy_to_device(size_t offset, const void* src, size_t bytes) override {
    if (!bytes) return;
    if (bytes > kStagingBytes) {
      ENGINE_CUDA_CHECK(cudaMemcpyAsync(pointer(offset), src, bytes, cudaMemcpyHostToDevice, g_stream));
      synchronize_and_check();
      return;
    }
    if (!staging_) {
      ENGINE_CUDA_CHECK(cudaHostAlloc(&staging_, kStagingBytes, cudaHostAllocDefault));
      ENGINE_CUDA_CHECK(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming));
    }
    if (staging_head_ + bytes > kStagingBytes) {  // wrap: every earlier copy out of the ring must be done
      ENGINE_CUDA_CHECK(cudaEventSynchronize(staged_));
      staging_head_ = 0;
    }
    char* stage = static_cast<char*>(staging_) + staging_head_;
    std::memcpy(stage, src, bytes);
    staging_head_ += (bytes + 255) / 256 * 256;
    ENGINE_CUDA_CHECK(cudaMemcpyAsync(pointer(offset), stage, bytes, cudaMemcpyHostToDevice, g_stream));
    ENGINE_CUDA_CHECK(cudaEventRecord(staged_, g_stream));
  }
  void copy_to_host(void* dst, size_t offset, size_t bytes) const override {
    if (!bytes) return;
    ENGINE_CUDA_CHECK(cudaMemcpyAsync(dst, pointer(offset), bytes, cudaMemcpyDeviceToHost, g_stream));
    synchronize_and_check();
  }
  void synchronize() override { synchronize_and_check(); }
  size_t device_memory_used() const override {
    size_t free_bytes = 0, total = 0;
    ENGINE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return total - free_bytes;
  }

 private:
  std::string product_;
  // The pinned staging ring of copy_to_device (host memory, allocated on first use; not the device's).
  static constexpr size_t kStagingBytes = size_t(64) << 20;
  void* staging_ = nullptr;
  size_t staging_head_ = 0;
  cudaEvent_t staged_ = nullptr;  // recorded after the latest copy out of the ring
  // The event clock: an origin event, then one event per allocation or free, read (and destroyed) by read_stamps.
  cudaEvent_t clock_origin_ = nullptr;
  std::vector<std::pair<int64_t, cudaEvent_t>> pending_;
  void start_clock() override {
    host_stamps_.clear();
    if (!clock_origin_) ENGINE_CUDA_CHECK(cudaEventCreate(&clock_origin_));
    ENGINE_CUDA_CHECK(cudaEventRecord(clock_origin_, g_stream));
  }
  // Called from release, which may run in a destructor: no throwing. An event that cannot be made is a missing
  // stamp (the timeline then interpolates), not an error.
  void stamp(int64_t seq) override {
    cudaEvent_t event = nullptr;
    if (cudaEventCreate(&event) != cudaSuccess) return;
    if (cudaEventRecord(event, g_stream) != cudaSuccess) {
      cudaEventDestroy(event);
      return;
    }
    pending_.emplace_back(seq, event);
  }
  std::vector<std::pair<int64_t, double>> read_stamps() override {
    for (auto& [seq, event] : pending_) {
      float ms = 0;
      ENGINE_CUDA_CHECK(cudaEventSynchronize(event));
      ENGINE_CUDA_CHECK(cudaEventElapsedTime(&ms, clock_origin_, event));
      ENGINE_CUDA_CHECK(cudaEventDestroy(event));
      host_stamps_.emplace_back(seq, double(ms));
    }
    pending_.clear();
    return host_stamps_;
  }
  void synchronize_quietly() {
    if (g_stream) cudaStreamSynchronize(g_stream);
  }
};

}  // namespace

}  // namespace engine::cuda

namespace engine {

std::shared_ptr<Device> create_cuda_device(size_t capacity) {
  using namespace engine::cuda;
  const int ordinal = select_rank_gpu();
  // What each piece takes outside the arena: cudaMemGetInfo after each (in a process's first device; a later one
  // finds them made and measures 0 for them).
  std::vector<std::pair<std::string, size_t>> stages;
  size_t used = 0;
  auto stage = [&](const char* what) {
    size_t free_now = 0, total_now = 0;
    ENGINE_CUDA_CHECK(cudaMemGetInfo(&free_now, &total_now));
    stages.emplace_back(what, total_now - free_now - used);
    used = total_now - free_now;
  };
  ENGINE_CUDA_CHECK(cudaFree(nullptr));  // creates the context
  stage("CUDA context (and anything else on the GPU before it)");
  for (const auto& [what, bytes] : noted_outside()) {  // made before the device: measured by their makers
    stages.front().second -= std::min(bytes, stages.front().second);
    stages.emplace_back(what, bytes);
  }
  noted_outside().clear();
  if (!g_stream) ENGINE_CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  stage("stream");
  if (!g_cublaslt) ENGINE_CUBLAS_CHECK(cublasLtCreate(&g_cublaslt));
  stage("cuBLASLt handle");
  cudaDeviceProp prop;
  ENGINE_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
  g_sms = prop.multiProcessorCount;
  g_cc = prop.major * 10 + prop.minor;
  size_t free_bytes = 0, total = 0;
  ENGINE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  size_t outside = total - free_bytes;
  if (capacity == 0) capacity = free_bytes > kLibraryReserve ? free_bytes - kLibraryReserve : 0;
  ENGINE_CHECK(capacity <= free_bytes, "device cuda: an arena of ", format_bytes(capacity),
               " does not fit: ", prop.name, " has ", format_bytes(free_bytes), " free of ", format_bytes(total), " (",
               format_bytes(outside), " taken by the CUDA context and libraries); ask for less with --memory");
  void* base = nullptr;
  ENGINE_CUDA_CHECK(cudaMalloc(&base, capacity));
  return std::shared_ptr<Device>(new CudaDevice(capacity, base, outside, prop.name, std::move(stages)));
}

}  // namespace engine
