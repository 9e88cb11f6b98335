// dist.h: ranks and their collectives (several processes training one model: data parallel).
//
// A world is `world_size` processes, one per GPU (or per cpu rank), each with its own device, arena and ledger.
// A Communicator is this process's membership: its rank and the collectives it takes part in. Every rank must
// call the same collectives in the same order (as in NCCL, Gloo and MPI). Backends:
//   gloo    cpu tensors, through Gloo (Facebook's collective library, the one PyTorch uses for cpu): its TCP
//           transport and a file-store rendezvous. Gloo is a shared library with its own dependencies, so the
//           engine loads it on first use from the plugin build/libengine_gloo.so (engine/gloo/): the programs
//           run without it on machines that need no cpu ranks.
//   meta    the meta device's: no values move, so a collective is a no-op; the world size is what the ranks'
//           shard sizes and buffers are computed from. Ranks are symmetric, so one meta process predicts
//           every rank of a world of any size.
//   nccl    cuda tensors, through NCCL on a stream of its own that waits for the engine's stream (so a started
//           all-reduce overlaps the kernels queued after it; engine/cuda/nccl.cpp: libnccl.so.2 loaded at run
//           time, from ENGINE_NCCL_LIBRARY, the loader's path or PyTorch's wheel); rank 0's unique id reaches the
//           others through the file store (or the Gloo plugin for a tcp:// store). A cuda rank uses GPU LOCAL_RANK
//           (modulo the GPUs it sees).
//   single  world size 1 on any device: every collective is the identity.
//
// How a process learns its place: the environment torchrun and Slurm launchers set (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR and MASTER_PORT: rank 0 serves the rendezvous there, the Gloo plugin's TCP store), or ENGINE_STORE_DIR,
// a directory every rank reaches where the rendezvous files are written (Gloo's file store; it wins when both are
// set). engine_train --nproc N sets them for the N processes it starts on one host.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/tensor.h"

namespace engine::dist {

// The collectives on tensors a rank has taken part in (host values, all_reduce_host and barrier, are not counted):
// how many, their bytes (what each rank contributes: the tensor's size), and the time this rank spent in them (Gloo:
// the wall time of the blocking call; NCCL: the stream time between events around each call, read when asked; meta:
// 0, as nothing moves, while the bytes are the prediction).
struct CommStats {
  int64_t calls = 0;
  double bytes = 0, seconds = 0;
};
struct CommTotals {
  CommStats all_reduce, broadcast;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  // The totals since the communicator was made (engine_train reports each step's).
  virtual CommTotals totals() { return totals_; }
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual const char* backend() const = 0;  // "gloo", "nccl", "meta", "single"
  // In place: every rank's `t` becomes the elementwise sum of all ranks' (f32, f64, bf16 or f16; contiguous,
  // on this rank's device). The order of the additions is the backend's (Gloo: a ring), the same on every rank.
  virtual void all_reduce_sum(const Tensor& t) = 0;
  // all_reduce_sum started where the backend can run it beside the work that follows (NCCL: on its own stream,
  // after the work queued so far), so that backward goes on while a bucket is summed; `t` is neither read nor
  // written by anyone until wait(). Backends that cannot (gloo, meta, single) sum at once.
  virtual void start_all_reduce_sum(const Tensor& t) { all_reduce_sum(t); }
  // What is queued from now on comes after every started collective (NCCL: the engine's stream waits for them).
  virtual void wait() {}
  // In place: every rank's `t` becomes rank `root`'s.
  virtual void broadcast(const Tensor& t, int root) = 0;
  // Host values summed over the ranks (a step's loss and item count for the report): no arena allocation.
  virtual void all_reduce_host(std::vector<double>& values) = 0;
  virtual void barrier() = 0;

 protected:
  CommTotals totals_;
};

// Where this process stands in a world, from the environment (all fields at their defaults when RANK and
// WORLD_SIZE are not set: a world of one).
struct WorldSpec {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string store_dir;  // ENGINE_STORE_DIR (the rendezvous directory), or "tcp://MASTER_ADDR:MASTER_PORT"
  std::string host;       // ENGINE_HOST: the address other ranks reach this one at (default: this host's name;
                          // engine_train --nproc sets 127.0.0.1)
};
// Reads RANK, WORLD_SIZE, LOCAL_RANK, ENGINE_STORE_DIR or MASTER_ADDR + MASTER_PORT, and ENGINE_HOST; a malformed
// or inconsistent value is an Error naming the variable and the fix.
WorldSpec world_from_environment();

// This process's communicator for `spec` on a device of type `device`: single for a world of one, meta on the meta
// device (no communication: the spec's world size only), gloo on cpu, nccl on cuda. Join before the device is made:
// a cuda rank's NCCL buffers must exist before its arena takes what is free (engine/cuda/nccl.cpp).
std::shared_ptr<Communicator> connect(const WorldSpec& spec, DeviceType device);
// An NCCL world for `spec`, of any size (1 included: the tests run data parallel through NCCL on one GPU); only in a
// build with CUDA. nccl_library(): which library it loaded and its version.
std::shared_ptr<Communicator> connect_nccl(const WorldSpec& spec);
std::string nccl_library();
// A meta communicator of `world_size` ranks, this one being `rank` (engine_train --device meta --world-size N).
std::shared_ptr<Communicator> meta_world(int world_size, int rank = 0);

// What the Gloo plugin implements (engine/gloo/gloo_communicator.cpp): collectives on host memory. The plugin links
// Gloo and nothing of the engine; connect() wraps it in a Communicator of Tensors.
class HostCollectives {
 public:
  enum Kind { f32, f64, bf16, f16 };
  virtual ~HostCollectives() = default;
  virtual void all_reduce_sum(void* data, size_t count, Kind kind) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
};
// The plugin's entry point: a connected world, or null with the reason in *error.
using GlooConnectFn = HostCollectives* (*)(int rank, int world_size, const char* store_dir, const char* host,
                                           std::string* error);
constexpr const char* kGlooConnectSymbol = "engine_gloo_connect";
// The plugin's entry point, loaded on first use (ENGINE_GLOO_PLUGIN, else beside the program or in ../lib); an Error
// saying how to build it when it does not load.
GlooConnectFn gloo_connect();

}  // namespace engine::dist
