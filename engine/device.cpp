// device.cpp: the cpu and meta devices, and the out-of-memory report.
#include "engine/device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "engine/format.h"

namespace engine {

const char* device_type_name(DeviceType t) {
  switch (t) {
    case DeviceType::cpu: return "cpu";
    case DeviceType::meta: return "meta";
    case DeviceType::cuda: return "cuda";
  }
  return "?";
}

DeviceType device_type_from_name(const std::string& name) {
  if (name == "cpu") return DeviceType::cpu;
  if (name == "meta") return DeviceType::meta;
  if (name == "cuda") return DeviceType::cuda;
  throw Error(str("unknown device '", name, "': expected cpu, meta or cuda"));
}

// ---------------------------------------------------------------------------------------------------
namespace {

class CpuDevice : public Device {
 public:
  CpuDevice(size_t capacity, void* base) : Device(DeviceType::cpu, capacity, base), bytes_(capacity) {}
  ~CpuDevice() override { if (base_) munmap(base_, bytes_); }
 private:
  size_t bytes_;
};

class MetaDevice : public Device {
 public:
  explicit MetaDevice(size_t capacity) : Device(DeviceType::meta, capacity, nullptr) {}
};

}  // namespace

#ifdef ENGINE_CUDA
std::shared_ptr<Device> create_cuda_device(size_t capacity);  // engine/cuda/cuda_device.cpp
#endif

std::shared_ptr<Device> Device::create(DeviceType type, size_t capacity) {
  switch (type) {
    case DeviceType::cpu: {
      void* base = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                        -1, 0);
      ENGINE_CHECK(base != MAP_FAILED, "cpu device: cannot reserve an arena of ", format_bytes(capacity),
                   " of address space (", std::strerror(errno), "); ask for less with --memory");
      return std::shared_ptr<Device>(new CpuDevice(capacity, base));
    }
    case DeviceType::meta:
      return std::shared_ptr<Device>(new MetaDevice(capacity));
    case DeviceType::cuda:
#ifdef ENGINE_CUDA
      return create_cuda_device(capacity);
#else
      throw Error("device cuda: this build has no CUDA support (nvcc was not found, or CUDA=0); "
                  "rebuild with nvcc on PATH, or use --device cpu or --device meta");
#endif
  }
  throw Error("unknown device type");
}

Device::Device(DeviceType type, size_t capacity, void* base)
    : type_(type), allocator_(capacity), base_(base) {}

Device::~Device() = default;

namespace {
thread_local const std::vector<int64_t>* g_allocating_shape = nullptr;  // set by Tensor::empty around it
thread_local DType g_allocating_dtype = DType::f32;
}  // namespace

AllocationScope::AllocationScope(const std::vector<int64_t>& shape, DType dtype) {
  g_allocating_shape = &shape;
  g_allocating_dtype = dtype;
}
AllocationScope::~AllocationScope() { g_allocating_shape = nullptr; }

std::string Device::allocation_description() {
  if (!g_allocating_shape) return "";
  std::string s = str(dtype_name(g_allocating_dtype), " [");
  for (size_t i = 0; i < g_allocating_shape->size(); i++) s += str(i ? ", " : "", (*g_allocating_shape)[i]);
  return s + "]";
}

Device::Block Device::allocate(size_t bytes, Category category) {
  auto offset = allocator_.allocate(bytes);
  if (!offset) throw OutOfMemory(oom_report(bytes), bytes, capacity());
  Block b;
  b.offset = *offset;
  b.bytes = bytes;
  b.id = ledger_.on_alloc(*offset, bytes, Allocator::round_up(bytes), category, ledger_.owner_now(), context().phase,
                          ledger_.detail() ? allocation_description() : std::string());
  ledger_.note_high_water(allocator_.high_water());
  if (clock_on_) stamp(ledger_.sequence());
  return b;
}

const Device::Block& Device::workspace(size_t bytes) {
  if (workspace_.id < 0) {
    workspace_ = allocate(bytes, Category::workspace);
    ledger_.set_owner(workspace_.id, "gemm workspace");
  }
  ENGINE_CHECK(bytes <= workspace_.bytes, "device workspace: ", bytes, " bytes asked, ", workspace_.bytes, " held");
  return workspace_;
}

void Device::release(const Block& block) {
  allocator_.free(block.offset);
  ledger_.on_free(block.id);
  if (clock_on_) stamp(ledger_.sequence());
}

void Device::set_event_clock(bool on) {
  ENGINE_CHECK(!on || type_ != DeviceType::meta,
               "the meta device computes nothing, so its events have no time: draw the timeline in allocation "
               "order, or run on cpu or cuda for a time axis");
  if (on && !clock_on_) start_clock();
  clock_on_ = on;
}

std::vector<std::pair<int64_t, double>> Device::event_times() { return read_stamps(); }

void Device::start_clock() {
  clock_start_ = std::chrono::steady_clock::now();
  host_stamps_.clear();
}

void Device::stamp(int64_t seq) {
  host_stamps_.emplace_back(
      seq, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - clock_start_).count());
}

std::vector<std::pair<int64_t, double>> Device::read_stamps() { return host_stamps_; }

void Device::copy_to_device(size_t offset, const void* src, size_t bytes) {
  if (base_ && bytes) std::memcpy(pointer(offset), src, bytes);
}

void Device::copy_to_host(void* dst, size_t offset, size_t bytes) const {
  if (base_ && bytes) std::memcpy(dst, pointer(offset), bytes);
  else if (bytes) std::memset(dst, 0, bytes);  // meta: there is no data
}

std::string Device::oom_report(size_t bytes) const {
  std::ostringstream os;
  size_t live = ledger_.live_bytes();
  os << "out of memory on " << name() << ": " << current_owner() << " (phase " << phase_name(context().phase)
     << ") requested " << format_bytes(Allocator::round_up(bytes)) << "; capacity " << format_bytes(capacity())
     << capacity_note_
     << ", live " << format_bytes(live) << ", free " << format_bytes(capacity() - allocator_.allocated())
     << ", largest free block " << format_bytes(allocator_.largest_free_block()) << ", fragmentation "
     << format_fixed(capacity() > live ? 100.0 * (capacity() - live - allocator_.largest_free_block()) /
                                             double(capacity() - live)
                                       : 0.0,
                     1)
     << "% of free space is not in the largest block.\n";
  os << "  live by category:";
  for (int c = 0; c < kNumCategories; c++)
    if (ledger_.live_bytes(Category(c)))
      os << " " << category_name(Category(c)) << " " << format_bytes(ledger_.live_bytes(Category(c))) << ";";
  os << "\n  largest live tensors:\n";
  std::vector<BlockInfo> blocks = ledger_.live_blocks();
  std::stable_sort(blocks.begin(), blocks.end(),
                   [](const BlockInfo& a, const BlockInfo& b) { return a.rounded > b.rounded; });
  for (size_t i = 0; i < blocks.size() && i < 10; i++)
    os << "    " << format_bytes(blocks[i].rounded) << "  " << category_name(blocks[i].category) << "  "
       << (blocks[i].owner.empty() ? "(untagged)" : blocks[i].owner) << "\n";
  os << "  fix: a smaller batch or sequence, --recompute, --attention flash, a lower --precision, or more "
        "--memory";
  return os.str();
}

// ---------------------------------------------------------------------------------------------------
namespace {
std::shared_ptr<Device>& default_slot() {
  static std::shared_ptr<Device> d;
  return d;
}
}  // namespace

namespace {
// A cgroup memory limit in bytes, 0 when there is none ("max", a v1 "unlimited" of 2^63 rounded to pages).
size_t cgroup_memory_limit(std::string* file) {
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::FILE* f = std::fopen(path, "r");
    if (!f) continue;
    char buf[64] = {0};
    const bool read = std::fgets(buf, sizeof buf, f) != nullptr;
    std::fclose(f);
    if (!read) continue;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(buf, &end, 10);
    if (end == buf) return 0;  // "max"
    *file = path;
    return v >= (1ULL << 60) ? 0 : size_t(v);
  }
  return 0;
}
}  // namespace

size_t cpu_memory_limit(std::string* why) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  size_t limit = pages > 0 && page > 0 ? size_t(pages) * size_t(page) : kDefaultCpuCapacity;
  std::string source = "physical memory " + format_bytes(limit), file;
  const size_t cgroup = cgroup_memory_limit(&file);
  if (cgroup > 0 && cgroup < limit) {
    limit = cgroup;
    source = "the cgroup memory limit " + format_bytes(cgroup) + " (" + file + ")";
  }
  const size_t reserve = std::max(limit / 10, size_t(256) << 20);
  if (why) *why = source + " less " + format_bytes(std::min(reserve, limit)) + " for the process itself";
  return limit > reserve ? limit - reserve : limit / 2;
}

std::shared_ptr<Device> default_device() {
  auto& d = default_slot();
  if (!d) d = Device::create(DeviceType::cpu, kDefaultCpuCapacity);
  return d;
}

void set_default_device(std::shared_ptr<Device> d) { default_slot() = std::move(d); }

}  // namespace engine
