// cuda/nccl.cpp: the NCCL communicator of cuda ranks (engine/dist.h), NCCL loaded at run time.
//
// NCCL is not linked: its library (libnccl.so.2, 200+ MB) is found when a cuda world is first joined, so the
// programs run on machines without it. Where: ENGINE_NCCL_LIBRARY, else the loader's search path (libnccl.so.2),
// else the copy PyTorch's wheels install (nvidia-nccl-cu*: site-packages/nvidia/nccl/lib) under the usual Python
// prefixes. The engine declares the few entry points it calls from NCCL's C ABI (nccl.h of NCCL 2: the unique id
// is 128 bytes, the data type and reduction enums are stable numbers), so building needs no NCCL header either.
//
// Collectives run on a stream of the communicator's own, each after what the engine's stream had queued when it was
// called (an event), in place on the arena's tensors: NCCL allocates no tensor the ledger sees. all_reduce_sum and
// broadcast make the engine's stream wait for them at once; start_all_reduce_sum (a gradient bucket) lets it run on
// (backward's next kernels overlap the sum) until wait().
// NCCL's own device memory (channels and buffers) is outside the arena, with the CUDA context and cuBLASLt's. A rank
// joins its world before its cuda device is made (tools/engine_train.cpp), with every peer connection made in
// ncclCommInitRank (NCCL_RUNTIME_CONNECT=0 unless set), so NCCL's memory is taken before the arena is sized to what
// is free, and the device's whole-GPU report names it. Host values (all_reduce_host, barrier) go through a 512-byte
// device scratch of the communicator's, also outside the arena, so that every rank's ledger is meta's.
// Rendezvous: rank 0 makes the unique id; the others read it from the file store (ENGINE_STORE_DIR: written to a
// temporary name and renamed, so a reader never sees half of it), or through the Gloo plugin's broadcast when the
// store is tcp:// (MASTER_ADDR / MASTER_PORT).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <glob.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/cuda/runtime.h"
#include "engine/dist.h"
#include "engine/error.h"

namespace engine::dist {

namespace {

// NCCL's C ABI, the part the engine calls (nccl.h).
using NcclResult = int;
constexpr NcclResult kNcclSuccess = 0;
struct NcclUniqueId {
  char internal[128];
};
using NcclComm = struct NcclCommOpaque*;
enum NcclDataType : int { kNcclFloat16 = 6, kNcclFloat32 = 7, kNcclFloat64 = 8, kNcclBfloat16 = 9 };
constexpr int kNcclSum = 0;

struct NcclApi {
  std::string path;
  int version = 0;
  NcclResult (*get_version)(int*) = nullptr;
  NcclResult (*get_unique_id)(NcclUniqueId*) = nullptr;
  NcclResult (*comm_init_rank)(NcclComm*, int, NcclUniqueId, int) = nullptr;
  NcclResult (*all_reduce)(const void*, void*, size_t, int, int, NcclComm, cudaStream_t) = nullptr;
  NcclResult (*broadcast)(const void*, void*, size_t, int, int, NcclComm, cudaStream_t) = nullptr;
  NcclResult (*comm_destroy)(NcclComm) = nullptr;
  const char* (*error_string)(NcclResult) = nullptr;
};

std::vector<std::string> nccl_candidates() {
  if (const char* given = std::getenv("ENGINE_NCCL_LIBRARY"); given && *given) return {given};
  std::vector<std::string> paths = {"libnccl.so.2"};
  std::vector<std::string> prefixes = {"/usr/local/lib", "/usr/lib", "/opt/conda/lib"};
  for (const char* env : {"VIRTUAL_ENV", "CONDA_PREFIX"})
    if (const char* p = std::getenv(env); p && *p) prefixes.insert(prefixes.begin(), std::string(p) + "/lib");
  if (const char* home = std::getenv("HOME"); home && *home) prefixes.push_back(std::string(home) + "/.local/lib");
  for (const std::string& prefix : prefixes)
    for (const char* packages : {"site-packages", "dist-packages"}) {
      const std::string pattern = prefix + "/python3*/" + packages + "/nvidia/nccl/lib/libnccl.so.2";
      glob_t g{};
      if (glob(pattern.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; i++) paths.push_back(g.gl_pathv[i]);
      globfree(&g);
    }
  return paths;
}

const NcclApi& nccl_api() {
  static std::mutex mu;
  static NcclApi api;
  std::lock_guard<std::mutex> lock(mu);
  if (api.all_reduce) return api;
  std::string errors;
  for (const std::string& path : nccl_candidates()) {
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      errors += str("\n  ", path, ": ", dlerror());
      continue;
    }
    auto sym = [&](const char* name) {
      void* f = dlsym(h, name);
      ENGINE_CHECK(f, path, " has no symbol ", name, ": not an NCCL 2 library (point ENGINE_NCCL_LIBRARY at one)");
      return f;
    };
    NcclApi a;
    a.path = path;
    a.get_version = reinterpret_cast<decltype(a.get_version)>(sym("ncclGetVersion"));
    a.get_unique_id = reinterpret_cast<decltype(a.get_unique_id)>(sym("ncclGetUniqueId"));
    a.comm_init_rank = reinterpret_cast<decltype(a.comm_init_rank)>(sym("ncclCommInitRank"));
    a.all_reduce = reinterpret_cast<decltype(a.all_reduce)>(sym("ncclAllReduce"));
    a.broadcast = reinterpret_cast<decltype(a.broadcast)>(sym("ncclBroadcast"));
    a.comm_destroy = reinterpret_cast<decltype(a.comm_destroy)>(sym("ncclCommDestroy"));
    a.error_string = reinterpret_cast<decltype(a.error_string)>(sym("ncclGetErrorString"));
    ENGINE_CHECK(a.get_version(&a.version) == kNcclSuccess && a.version >= 20000, path, " reports NCCL version ",
                 a.version, ": NCCL 2 is needed");
    api = a;
    return api;
  }
  throw Error(str("cuda ranks need NCCL (libnccl.so.2), which did not load:", errors,
                  "\nInstall it (Debian: libnccl2; PyTorch's wheels bring nvidia-nccl-cu*), or point "
                  "ENGINE_NCCL_LIBRARY at libnccl.so.2"));
}

void nccl_check(NcclResult r, const char* what) {
  ENGINE_CHECK(r == kNcclSuccess, "NCCL ", what, " failed: ", nccl_api().error_string(r), " (NCCL ", nccl_api().version,
               ", ", nccl_api().path, ")");
}

int nccl_type(DType d) {
  switch (d) {
    case DType::f32:
      return kNcclFloat32;
    case DType::f64:
      return kNcclFloat64;
    case DType::bf16:
      return kNcclBfloat16;
    case DType::f16:
      return kNcclFloat16;
    default:
      throw Error(str("all_reduce_sum: no sum of ", dtype_name(d), " tensors (floating point only)"));
  }
}

// Rank 0's unique id, given to every rank.
NcclUniqueId share_unique_id(const WorldSpec& spec) {
  NcclUniqueId id{};
  if (spec.rank == 0) nccl_check(nccl_api().get_unique_id(&id), "ncclGetUniqueId");
  if (spec.world_size == 1) return id;
  if (spec.store_dir.rfind("tcp://", 0) == 0) {  // through the Gloo plugin's host broadcast
    std::string error;
    std::unique_ptr<HostCollectives> host(
        gloo_connect()(spec.rank, spec.world_size, spec.store_dir.c_str(), spec.host.c_str(), &error));
    ENGINE_CHECK(host, "rank ", spec.rank, " of ", spec.world_size, " could not meet the others at ", spec.store_dir,
                 " to share NCCL's id: ", error);
    host->broadcast(&id, sizeof id, 0);
    return id;
  }
  const std::string path = spec.store_dir + "/nccl_unique_id";
  if (spec.rank == 0) {
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(id.internal, sizeof id.internal);
      ENGINE_CHECK(out.good(), "rank 0 could not write NCCL's id to ", tmp, ": is ENGINE_STORE_DIR writable?");
    }
    ENGINE_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "rank 0 could not rename ", tmp, " to ", path);
    return id;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  for (;;) {
    std::ifstream in(path, std::ios::binary);
    if (in && in.read(id.internal, sizeof id.internal) && in.gcount() == sizeof id.internal) return id;
    ENGINE_CHECK(std::chrono::steady_clock::now() < deadline, "rank ", spec.rank,
                 " waited 300 s for rank 0's NCCL id in ", path,
                 ": is rank 0 running, with the same ENGINE_STORE_DIR?");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

size_t device_memory_used() {
  size_t free_bytes = 0, total = 0;
  ENGINE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return total - free_bytes;
}

class Nccl : public Communicator {
 public:
  explicit Nccl(const WorldSpec& spec) : rank_(spec.rank), world_size_(spec.world_size) {
    engine::cuda::select_rank_gpu();
    ENGINE_CUDA_CHECK(cudaFree(nullptr));  // the context first, so that the measure below is NCCL's alone
    const size_t before = device_memory_used();
    const NcclUniqueId id = share_unique_id(spec);
    nccl_check(nccl_api().comm_init_rank(&comm_, world_size_, id, rank_), "ncclCommInitRank");
    ENGINE_CUDA_CHECK(cudaMalloc(&scratch_, kScratchBytes));
    ENGINE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ENGINE_CUDA_CHECK(cudaEventCreateWithFlags(&queued_, cudaEventDisableTiming));
    ENGINE_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    const size_t after = device_memory_used();
    engine::cuda::note_outside_arena("NCCL communicator (channels, peer buffers)", after > before ? after - before : 0);
  }
  ~Nccl() override {
    if (stream_) cudaStreamSynchronize(stream_);
    totals();  // the pending events
    if (scratch_) cudaFree(scratch_);
    if (comm_) nccl_api().comm_destroy(comm_);
    if (queued_) cudaEventDestroy(queued_);
    if (done_) cudaEventDestroy(done_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  const char* backend() const override { return "nccl"; }
  void all_reduce_sum(const Tensor& t) override {
    start_all_reduce_sum(t);
    wait();
  }
  void start_all_reduce_sum(const Tensor& t) override {
    ENGINE_CHECK(t.is_contiguous() && t.device().type() == DeviceType::cuda,
                 "all_reduce_sum: the tensor must be contiguous and on this rank's GPU");
    if (t.numel() == 0) return;
    const int kind = nccl_type(t.dtype());
    after_queued_work();
    timed(totals_.all_reduce, t.nbytes(), [&] {
      nccl_check(nccl_api().all_reduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), kind, kNcclSum, comm_, stream_),
                 "ncclAllReduce");
    });
  }
  void wait() override {
    ENGINE_CUDA_CHECK(cudaEventRecord(done_, stream_));
    ENGINE_CUDA_CHECK(cudaStreamWaitEvent(engine::cuda::stream(), done_, 0));
  }
  void broadcast(const Tensor& t, int root) override {
    ENGINE_CHECK(t.is_contiguous() && t.device().type() == DeviceType::cuda,
                 "broadcast: the tensor must be contiguous and on this rank's GPU");
    if (t.nbytes() == 0) return;
    after_queued_work();
    // As bytes: any dtype (NCCL's int8, 0).
    timed(totals_.broadcast, t.nbytes(), [&] {
      nccl_check(nccl_api().broadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), 0, root, comm_, stream_),
                 "ncclBroadcast");
    });
    wait();
  }
  void all_reduce_host(std::vector<double>& values) override {
    for (size_t at = 0; at < values.size(); at += kScratchBytes / sizeof(double)) {
      const size_t n = std::min(values.size() - at, kScratchBytes / sizeof(double));
      after_queued_work();  // (and after any started collective: the same stream)
      ENGINE_CUDA_CHECK(
          cudaMemcpyAsync(scratch_, values.data() + at, n * sizeof(double), cudaMemcpyHostToDevice, stream_));
      nccl_check(nccl_api().all_reduce(scratch_, scratch_, n, kNcclFloat64, kNcclSum, comm_, stream_), "ncclAllReduce");
      ENGINE_CUDA_CHECK(
          cudaMemcpyAsync(values.data() + at, scratch_, n * sizeof(double), cudaMemcpyDeviceToHost, stream_));
      ENGINE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
  }
  void barrier() override {
    std::vector<double> one = {0.0};
    all_reduce_host(one);
  }

 private:
  // The collectives' stream waits for what the engine's stream has queued (the tensor's producers).
  void after_queued_work() {
    ENGINE_CUDA_CHECK(cudaEventRecord(queued_, engine::cuda::stream()));
    ENGINE_CUDA_CHECK(cudaStreamWaitEvent(stream_, queued_, 0));
  }
  // Runs `call` (one collective on the collectives' stream) between two events, counted in `s` when read: the
  // collective's own time, whatever it overlapped.
  template <typename F>
  void timed(CommStats& s, size_t bytes, F call) {
    cudaEvent_t start, stop;
    ENGINE_CUDA_CHECK(cudaEventCreate(&start));
    ENGINE_CUDA_CHECK(cudaEventCreate(&stop));
    ENGINE_CUDA_CHECK(cudaEventRecord(start, stream_));
    call();
    ENGINE_CUDA_CHECK(cudaEventRecord(stop, stream_));
    s.calls++, s.bytes += double(bytes);
    pending_.push_back({&s, start, stop});
  }
  static constexpr size_t kScratchBytes = 512;
  struct Pending {
    CommStats* stats;
    cudaEvent_t start, stop;
  };
  std::vector<Pending> pending_;
  int rank_, world_size_;
  NcclComm comm_ = nullptr;
  void* scratch_ = nullptr;
  cudaStream_t stream_ = nullptr;  // every collective runs here, in the order called (as NCCL needs)
  cudaEvent_t queued_ = nullptr, done_ = nullptr;
};

}  // namespace

std::shared_ptr<Communicator> connect_nccl(const WorldSpec& spec) {
  // Every connection made now, in ncclCommInitRank, not lazily at the first collective (NCCL 2.22 and later):
  // the rank joins before its arena takes the GPU's free memory, so NCCL's buffers must all exist by then. A value
  // the user set is kept.
  setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  ENGINE_CHECK(spec.world_size >= 1 && spec.rank >= 0 && spec.rank < spec.world_size, "a world of ", spec.world_size,
               " ranks has no rank ", spec.rank);
  ENGINE_CHECK(spec.world_size == 1 || !spec.store_dir.empty(), "rank ", spec.rank, " of ", spec.world_size,
               ": NCCL's id needs a rendezvous (ENGINE_STORE_DIR, or MASTER_ADDR and MASTER_PORT)");
  return std::make_shared<Nccl>(spec);
}

std::string nccl_library() { return nccl_api().path + " (NCCL " + std::to_string(nccl_api().version) + ")"; }

}  // namespace engine::dist
