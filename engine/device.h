// device.h: a device = one arena of `capacity` bytes + the allocator that places blocks in it + the ledger
// that says who holds them.
//
//   cpu   one mmap(MAP_NORESERVE) range: pages cost nothing until touched.
//   meta  no storage at all: only offsets. Ops check shapes and allocate, then run no kernel.
//   cuda  one cudaMalloc at start (engine/cuda/, built when nvcc is found).
//
// Tensors never allocate any other way. Because the allocator is pure policy over offsets, the meta
// device makes exactly the placement decisions the cpu and cuda devices make for the same program.
#pragma once
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/allocator.h"
#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/ledger.h"

namespace engine {

// Names the tensor whose storage is being allocated (Tensor::empty), for the ledger's detail.
struct AllocationScope {
  AllocationScope(const std::vector<int64_t>& shape, DType dtype);
  ~AllocationScope();
  AllocationScope(const AllocationScope&) = delete;
  AllocationScope& operator=(const AllocationScope&) = delete;
};

enum class DeviceType : uint8_t { cpu, meta, cuda };
const char* device_type_name(DeviceType t);
DeviceType device_type_from_name(const std::string& name);  // "cpu" | "meta" | "cuda", else Error

// Thrown before any kernel runs when a request does not fit. what() is the full report.
struct OutOfMemory : Error {
  OutOfMemory(const std::string& report, size_t requested, size_t capacity)
      : Error(report), requested(requested), capacity(capacity) {}
  size_t requested, capacity;
};

class Device {
 public:
  // capacity in bytes. cpu: virtual range reserved with MAP_NORESERVE. meta: any size.
  static std::shared_ptr<Device> create(DeviceType type, size_t capacity);
  virtual ~Device();

  DeviceType type() const { return type_; }
  // The hardware's own name ("NVIDIA H200"), or "" for cpu and meta.
  virtual std::string product() const { return ""; }
  std::string name() const { return device_type_name(type_); }
  size_t capacity() const { return allocator_.capacity(); }
  // Where the capacity came from ("gpu rtx2070: ...", "the cgroup memory limit ..."), for the OOM report.
  void set_capacity_note(std::string note) { capacity_note_ = std::move(note); }
  Allocator& allocator() { return allocator_; }
  const Ledger& ledger() const { return ledger_; }
  Ledger& ledger() { return ledger_; }
  // Memory the device uses outside the arena (cuda: context + libraries, measured before the arena's
  // cudaMalloc), printed in engine_train's header.
  size_t outside_arena() const { return outside_arena_; }
  // What the device's creation measured outside the arena, stage by stage, in order (cuda: the context, the
  // stream, cuBLASLt, each a cudaMemGetInfo difference); empty elsewhere.
  const std::vector<std::pair<std::string, size_t>>& outside_stages() const { return outside_stages_; }
  // The whole device's memory in use now, as the driver counts it (cuda: cudaMemGetInfo's total - free: the
  // context, the libraries, the arena's one cudaMalloc, and what loaded lazily since, such as the kernels' module
  // images on their first launch); 0 on cpu and meta.
  virtual size_t device_memory_used() const { return 0; }

  struct Block {
    size_t offset = 0, bytes = 0;
    int64_t id = -1;
  };
  // What the tensor being allocated is ("f32 [8, 64]"), while Tensor::empty allocates its storage; "" otherwise.
  static std::string allocation_description();
  // Allocates with tags from the current context; throws OutOfMemory with the full report.
  Block allocate(size_t bytes, Category category);
  void release(const Block& block);
  // A block tagged `workspace` of `bytes`, allocated on first use and kept while the device lives
  // (cuBLASLt's GEMM workspace). Ops ask for it on every device type at the same moment, so the meta
  // device's placements stay those of cuda. Asking again with a larger size is an Error.
  const Block& workspace(size_t bytes);
  // Pointer to arena offset (nullptr on meta).
  void* pointer(size_t offset) const { return base_ ? static_cast<char*>(base_) + offset : nullptr; }

  // Copies between host memory and the arena (memcpy on cpu, cudaMemcpy on cuda, nothing on meta). On cuda a small
  // copy_to_device returns once src is staged, the copy queued on the engine's stream (ordered like a kernel);
  // copy_to_host returns with the bytes in dst.
  virtual void copy_to_device(size_t offset, const void* src, size_t bytes);
  virtual void copy_to_host(void* dst, size_t offset, size_t bytes) const;
  virtual void synchronize() {}

  // The out-of-memory report for a request of `bytes` (also used by the max-batch finder's messages).
  std::string oom_report(size_t bytes) const;

  // The event clock (the memory timeline's time axis: engine_train --timeline-axis time, engine_bench trace). While
  // on, every allocation and free is stamped with the device's own time: on cpu the host clock (its kernels run
  // synchronously, so an event's host time is when it happened); on cuda a CUDA event recorded on the engine's
  // stream, so the stamp is the moment the GPU reached that point of the stream (every kernel enqueued before it
  // done), not when the host enqueued it. meta computes nothing and has no time: it refuses the clock.
  void set_event_clock(bool on);
  bool event_clock() const { return clock_on_; }
  // The stamps since the clock was switched on: (ledger sequence number, milliseconds since then), in order.
  // Waits for the device; the stamps are kept (a later call returns them and the newer ones).
  std::vector<std::pair<int64_t, double>> event_times();

 protected:
  Device(DeviceType type, size_t capacity, void* base);
  DeviceType type_;
  Allocator allocator_;
  Ledger ledger_;
  void* base_;
  size_t outside_arena_ = 0;
  std::vector<std::pair<std::string, size_t>> outside_stages_;
  std::string capacity_note_;
  Block workspace_;
  bool clock_on_ = false;
  // Stamps the ledger's latest event; reads the stamps as milliseconds since the clock began. The base class uses
  // the host clock; the cuda device records events on its stream.
  virtual void start_clock();
  virtual void stamp(int64_t seq);
  virtual std::vector<std::pair<int64_t, double>> read_stamps();
  std::chrono::steady_clock::time_point clock_start_;
  std::vector<std::pair<int64_t, double>> host_stamps_;
};

// The memory a cpu arena may use on this machine: physical memory, or the cgroup's memory limit (a container's,
// cgroup v2 memory.max or v1 memory.limit_in_bytes) when that is lower, less a reserve for the process's own
// host memory (a tenth, at least 256 MiB). `why` says which limit it used, for the run's header and OOM report.
size_t cpu_memory_limit(std::string* why);

// The device that factories use when none is named. Starts as a cpu device of kDefaultCpuCapacity;
// DeviceGuard switches it for a scope.
constexpr size_t kDefaultCpuCapacity = size_t(64) << 30;
std::shared_ptr<Device> default_device();
void set_default_device(std::shared_ptr<Device> d);

class DeviceGuard {
 public:
  explicit DeviceGuard(std::shared_ptr<Device> d) : saved_(default_device()) { set_default_device(std::move(d)); }
  ~DeviceGuard() { set_default_device(saved_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
 private:
  std::shared_ptr<Device> saved_;
};

}  // namespace engine
