// dist.cpp: the world from the environment, the single and meta communicators, and loading the Gloo plugin.
#include "engine/dist.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <mutex>

#include "engine/error.h"

namespace engine::dist {

namespace {

// An integer environment variable; `fallback` when unset.
int env_int(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  ENGINE_CHECK(errno == 0 && end && *end == '\0' && x >= lo && x <= hi, "the environment variable ", name, "=", v,
               " is not an integer from ", lo, " to ", hi, "; unset it or give one (as torchrun and Slurm set it)");
  return int(x);
}

std::string env_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// World size 1: every collective is the identity.
class Single : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  const char* backend() const override { return "single"; }
  void all_reduce_sum(const Tensor&) override {}
  void broadcast(const Tensor&, int) override {}
  void all_reduce_host(std::vector<double>&) override {}
  void barrier() override {}
};

// The meta device's world: nothing moves (meta tensors hold no values); host values are taken as every rank's
// own, so their sum is world_size times this rank's.
class Meta : public Communicator {
 public:
  Meta(int world_size, int rank) : world_size_(world_size), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  const char* backend() const override { return "meta"; }
  void all_reduce_sum(const Tensor& t) override { totals_.all_reduce.calls++, totals_.all_reduce.bytes += t.nbytes(); }
  void broadcast(const Tensor& t, int) override { totals_.broadcast.calls++, totals_.broadcast.bytes += t.nbytes(); }
  void all_reduce_host(std::vector<double>& values) override {
    for (double& v : values) v *= world_size_;
  }
  void barrier() override {}

 private:
  int world_size_, rank_;
};

// cpu ranks: the Gloo plugin's collectives on the tensors' host memory.
class Gloo : public Communicator {
 public:
  Gloo(std::unique_ptr<HostCollectives> c, int rank, int world_size)
      : c_(std::move(c)), rank_(rank), world_size_(world_size) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  const char* backend() const override { return "gloo"; }
  void all_reduce_sum(const Tensor& t) override {
    ENGINE_CHECK(t.is_contiguous(), "all_reduce_sum: the tensor must be contiguous");
    const auto t0 = std::chrono::steady_clock::now();
    c_->all_reduce_sum(t.data_ptr(), size_t(t.numel()), kind_of(t.dtype()));
    add(totals_.all_reduce, t.nbytes(), t0);
  }
  void broadcast(const Tensor& t, int root) override {
    ENGINE_CHECK(t.is_contiguous(), "broadcast: the tensor must be contiguous");
    const auto t0 = std::chrono::steady_clock::now();
    c_->broadcast(t.data_ptr(), t.nbytes(), root);
    add(totals_.broadcast, t.nbytes(), t0);
  }
  void all_reduce_host(std::vector<double>& values) override {
    if (!values.empty()) c_->all_reduce_sum(values.data(), values.size(), HostCollectives::f64);
  }
  void barrier() override { c_->barrier(); }

 private:
  static void add(CommStats& s, size_t bytes, std::chrono::steady_clock::time_point t0) {
    s.calls++, s.bytes += double(bytes);
    s.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  static HostCollectives::Kind kind_of(DType d) {
    switch (d) {
      case DType::f32:
        return HostCollectives::f32;
      case DType::f64:
        return HostCollectives::f64;
      case DType::bf16:
        return HostCollectives::bf16;
      case DType::f16:
        return HostCollectives::f16;
      default:
        throw Error(str("all_reduce_sum: no sum of ", dtype_name(d), " tensors (floating point only)"));
    }
  }
  std::unique_ptr<HostCollectives> c_;
  int rank_, world_size_;
};

// The directory of the running program (/proc/self/exe), where the build and `make install` put the plugin.
std::string program_dir() {
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return ".";
  path[n] = '\0';
  std::string p(path);
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

}  // namespace

// ENGINE_GLOO_PLUGIN, else libengine_gloo.so beside the program, else in ../lib (an installed prefix).
GlooConnectFn gloo_connect() {
  static std::mutex mu;
  static GlooConnectFn fn = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (fn) return fn;
  std::vector<std::string> tried;
  const std::string given = env_str("ENGINE_GLOO_PLUGIN");
  if (!given.empty())
    tried.push_back(given);
  else
    tried = {program_dir() + "/libengine_gloo.so", program_dir() + "/../lib/libengine_gloo.so"};
  std::string errors;
  for (const std::string& path : tried) {
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      errors += str("\n  ", path, ": ", dlerror());
      continue;
    }
    fn = reinterpret_cast<GlooConnectFn>(dlsym(h, kGlooConnectSymbol));
    ENGINE_CHECK(fn, path, " has no symbol ", kGlooConnectSymbol,
                 ": it is not the engine's Gloo plugin; rebuild it "
                 "with make (it is build/libengine_gloo.so)");
    return fn;
  }
  throw Error(str("cpu ranks need the engine's Gloo plugin, which did not load:", errors,
                  "\nBuild it with `make` (it needs Debian's libgloo-dev, which make installs when run as root), or "
                  "point ENGINE_GLOO_PLUGIN at it"));
}

WorldSpec world_from_environment() {
  WorldSpec s;
  const bool has_rank = std::getenv("RANK"), has_size = std::getenv("WORLD_SIZE");
  ENGINE_CHECK(has_rank == has_size, "the environment sets ", has_rank ? "RANK" : "WORLD_SIZE", " but not ",
               has_rank ? "WORLD_SIZE" : "RANK", ": a rank needs both (and ENGINE_STORE_DIR)");
  if (!has_rank) return s;
  s.world_size = env_int("WORLD_SIZE", 1, 1, 1 << 20);
  s.rank = env_int("RANK", 0, 0, s.world_size - 1);
  s.local_rank = env_int("LOCAL_RANK", s.rank, 0, 1 << 20);
  s.store_dir = env_str("ENGINE_STORE_DIR");
  s.host = env_str("ENGINE_HOST");
  const std::string addr = env_str("MASTER_ADDR");
  if (s.store_dir.empty() && !addr.empty() && std::getenv("MASTER_PORT")) {
    const int port = env_int("MASTER_PORT", 0, 1, 65535);
    s.store_dir = str("tcp://", addr, ":", port);
  }
  ENGINE_CHECK(s.world_size == 1 || !s.store_dir.empty(), "RANK=", s.rank, " WORLD_SIZE=", s.world_size,
               ": neither ENGINE_STORE_DIR nor MASTER_ADDR and MASTER_PORT is set, so the ranks cannot meet. Set "
               "MASTER_ADDR and MASTER_PORT to rank 0's host and a free port (as torchrun and Slurm scripts do), or "
               "ENGINE_STORE_DIR to a fresh directory on a file system every rank reaches, or start the ranks with "
               "engine_train --nproc N on one host");
  return s;
}

std::shared_ptr<Communicator> meta_world(int world_size, int rank) {
  ENGINE_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "a world of ", world_size, " ranks has no rank ",
               rank);
  return std::make_shared<Meta>(world_size, rank);
}

std::shared_ptr<Communicator> connect(const WorldSpec& spec, DeviceType device) {
  if (device == DeviceType::meta) return meta_world(spec.world_size, spec.rank);
  if (spec.world_size == 1) return std::make_shared<Single>();
#ifdef ENGINE_CUDA
  if (device == DeviceType::cuda) return connect_nccl(spec);
#endif
  ENGINE_CHECK(device == DeviceType::cpu, "a world of ", spec.world_size, " ranks on ", device_type_name(device),
               ": only cpu (Gloo), cuda (NCCL, in a build with CUDA) and meta ranks exist");
  std::string error;
  std::unique_ptr<HostCollectives> c(
      gloo_connect()(spec.rank, spec.world_size, spec.store_dir.c_str(), spec.host.c_str(), &error));
  ENGINE_CHECK(c, "rank ", spec.rank, " of ", spec.world_size, " could not join the Gloo world at ", spec.store_dir,
               ": ", error);
  return std::make_shared<Gloo>(std::move(c), spec.rank, spec.world_size);
}

}  // namespace engine::dist
