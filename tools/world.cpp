// world.cpp: engine_train's data-parallel flags, their checks, the header line and the per-rank step report.
#include "tools/world.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "engine/error.h"
#include "engine/format.h"
#include "engine/json.h"
#include "graph/data_parallel.h"
#include "graph/parameter_shards.h"
#include "tools/launcher.h"

#ifdef ENGINE_CUDA
#include <cuda_runtime.h>
#endif

namespace tools {

using engine::format_bytes;
using engine::format_fixed;
using engine::str;

void add_world_flags(Flags& flags) {
  flags.add_int("nproc", 1,
                "data parallel on this host: run N ranks (processes) of one world, each with its part of the "
                "global batch (--batch per rank) and its own arena and ledger; cpu ranks use Gloo, cuda ranks NCCL "
                "(one GPU each). Rank 0 prints and saves; the other ranks write their --json/--report/--timeline/"
                "--trace as FILE.rank<r>");
  flags.add_int("world-size", 0,
                "on meta: predict one rank of a data-parallel world of N ranks (its gradient buckets; no "
                "communication). Ranks started by a launcher read RANK and WORLD_SIZE instead (engine/dist.h)");
  flags.add_int("bucket-mb", 25, "data parallel: the gradient bucket size in MiB (PyTorch DDP's bucket_cap_mb)");
  flags.add_choice("zero", "0", {"0", "1", "2", "3"},
                   "data parallel with ZeRO: 1 shards the optimizer state and f32 masters over the ranks, 2 the "
                   "gradients too (DeepSpeed's partition of the flattened parameters: graph/data_parallel.h), 3 the "
                   "parameters too, gathered per layer while it runs (graph/parameter_shards.h)");
  flags.add_bool("bucket-view",
                 "data parallel: every gradient a view into its bucket (PyTorch DDP's "
                 "gradient_as_bucket_view): no second copy of the gradients; not with --zero 2");
  flags.add_int("rank", 0, "with --world-size on meta: the rank to predict (ranks differ under --zero)");
}

bool nproc_given(const Flags& flags) { return flags.integer("nproc") != 1; }

namespace {
// The CUDA GPUs this process sees (0 without a driver, or in a build without CUDA).
int visible_gpus() {
#ifdef ENGINE_CUDA
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
#else
  return 0;
#endif
}
}  // namespace

int launch_nproc(const Flags& flags, int argc, char** argv) {
  ENGINE_CHECK(flags.integer("nproc") > 1, "engine_train: --nproc ", flags.integer("nproc"),
               " must be 1 or more ranks");
  const std::string device = flags.str("device");
  ENGINE_CHECK(device != "meta",
               "engine_train: --nproc runs cpu ranks (Gloo) or cuda ranks (NCCL); for --device meta use "
               "--world-size N: one meta process predicts every rank");
  if (device == "cuda") {  // one GPU per rank (rank r takes GPU LOCAL_RANK = r): NCCL refuses two ranks on one GPU
    const int gpus = visible_gpus();
    ENGINE_CHECK(flags.integer("nproc") <= gpus, "engine_train: --nproc ", flags.integer("nproc"),
                 " cuda ranks need as many GPUs, one each; this host shows ", gpus, ". Give --nproc ",
                 std::max(gpus, 1), " or fewer, or --device meta --world-size ", flags.integer("nproc"),
                 " to predict each rank's memory without them");
  }
  ENGINE_CHECK(std::getenv("RANK") == nullptr,
               "engine_train: --nproc inside a launched rank (RANK is set): give one or the other");
  return launch_ranks(int(flags.integer("nproc")),
                      without_flag(std::vector<std::string>(argv + 1, argv + argc), "nproc"));
}

World world_of(const Flags& flags) {
  World w;
  w.env = engine::dist::world_from_environment();
  const int64_t predicted = flags.integer("world-size");
  const bool meta = flags.str("device") == "meta";
  ENGINE_CHECK(predicted >= 0 && predicted <= (1 << 20), "engine_train: --world-size ", predicted,
               " must be 1 to 2^20 ranks");
  ENGINE_CHECK(predicted <= 1 || meta,
               "engine_train: --world-size predicts a world on the meta device; to train one, start the ranks with "
               "--nproc N (cpu) or a launcher that sets RANK and WORLD_SIZE");
  w.world_size = predicted > 1 ? int(predicted) : w.env.world_size;
  w.zero = std::stoi(flags.str("zero"));
  ENGINE_CHECK(w.zero == 0 || w.world_size > 1, "engine_train: --zero ", w.zero,
               " shards over the ranks of a data-parallel world: give --nproc N (cpu) or --world-size N (meta)");
  const int64_t rank = flags.integer("rank");
  ENGINE_CHECK(!flags.given("rank") || (predicted > 1 && rank >= 0 && rank < predicted), "engine_train: --rank ", rank,
               " is a rank of the meta prediction of --world-size N: 0 to N - 1");
  w.rank = flags.given("rank") ? int(rank) : w.env.rank;
  w.bucket_mb = flags.integer("bucket-mb");
  ENGINE_CHECK(w.bucket_mb >= 1 && w.bucket_mb <= (1 << 20), "engine_train: --bucket-mb ", w.bucket_mb,
               " must be 1 or more");
  w.bucket_view = flags.on("bucket-view");
  ENGINE_CHECK(w.world_size > 1 || (!flags.given("bucket-mb") && !w.bucket_view),
               "engine_train: --bucket-mb and --bucket-view set the gradient buckets of a data-parallel world, which "
               "one process does not have: give --nproc N (cpu ranks), start the ranks with a launcher that sets "
               "WORLD_SIZE, or predict them with --device meta --world-size N");
  if (w.world_size == 1) return w;
  ENGINE_CHECK(!flags.on("find-max-batch") || meta,
               "engine_train: --find-max-batch of a data-parallel world runs on meta (--device meta --world-size N): "
               "its probes are ranks of that world; cpu ranks would have to probe in step with each other");
  ENGINE_CHECK(!meta || flags.str("load").empty(),
               "engine_train: --load with --world-size on meta: the prediction of a rank starts from a fresh model; "
               "drop --load (the checkpoint's weights do not change any rank's memory)");
  ENGINE_CHECK(!flags.on("inference"), "engine_train: --inference runs one process; data parallel is for training");
  return w;
}

void World::apply(models::ModelConfig& config) const {
  config.world_size = world_size;
  config.rank = rank;
  config.zero = zero;
  config.bucket_mb = bucket_mb;
  config.bucket_view = bucket_view;
}

std::string World::rank_path(const std::string& path) const {
  return env.rank == 0 || path.empty() ? path : path + ".rank" + std::to_string(env.rank);
}

std::string data_parallel_line(models::Model& model) {
  size_t n = 0, bytes = 0;
  std::string backend;
  bool views = false;
  for (const graph::GradientReducer* r : model.reducers()) {
    backend = r->communicator().backend();
    views = r->bucket_view();
    n += r->buckets().size();
    bytes += r->held_bytes();
  }
  std::string zero;
  if (model.zero_stage() > 0) {
    size_t mine = 0, all = 0;
    int64_t elements = 0, total = 0;
    for (const graph::GradientReducer* r : model.reducers()) mine += r->shard().size(), elements += r->shard_elements();
    for (const auto& np : model.module().named_parameters())
      if (np.second.requires_grad()) all++, total += np.second.numel();
    zero = str(" | ZeRO-", model.zero_stage(), ": this rank updates ", elements, " of ", total, " elements (pieces of ",
               mine, " of ", all, " parameters)");
  }
  if (const graph::ParameterShards* shards = model.parameter_shards()) {
    size_t largest = 0;
    for (size_t u = 1; u < shards->units().size(); u++) largest = std::max(largest, shards->units()[u].bytes);
    zero += str("; it keeps them (", format_bytes(shards->shard_bytes()), ") and gathers the rest per unit: the root ",
                format_bytes(shards->units()[0].bytes), " for the whole step, ", shards->units().size() - 1,
                " layers of up to ", format_bytes(largest), " while they run");
  }
  return str("data parallel: rank ", model.rank(), " of ", model.world_size(), " (", backend,
             ") | gradient buckets: ", n, ", ", format_bytes(bytes),
             views ? " (category grad: the gradients are views into them)"
                   : " of staging, the largest bucket's size (category comm)",
             zero, " | the loss and items are the world's");
}

WorldStep world_step(models::Model& model, const engine::dist::CommTotals& before, double ms, size_t peak) {
  const engine::dist::CommTotals now = model.communication();
  auto delta = [](const engine::dist::CommStats& a, const engine::dist::CommStats& b) {
    return std::vector<double>{double(a.calls - b.calls), a.bytes - b.bytes, a.seconds - b.seconds};
  };
  std::vector<double> mine = {ms, double(peak)};
  for (const auto& d : {delta(now.all_reduce, before.all_reduce), delta(now.broadcast, before.broadcast)})
    mine.insert(mine.end(), d.begin(), d.end());
  const size_t n = mine.size();
  const std::vector<double> all = model.gather_over_ranks(mine);
  WorldStep w;
  w.world = model.world_size();
  for (int r = 0; r < w.world; r++) {
    w.ms.push_back(all[r * n]);
    w.peak.push_back(all[r * n + 1]);
    if (w.ms[r] > w.ms[w.slowest]) w.slowest = r;
    if (w.peak[r] > w.peak[w.largest]) w.largest = r;
    if (w.peak[r] < w.peak[w.smallest]) w.smallest = r;
  }
  const char* names[] = {"all-reduce", "broadcast"};
  for (size_t k = 0; k < 2; k++) {
    const double* c = &all[w.slowest * n + 2 + 3 * k];
    w.collectives.push_back({names[k], c[0], c[1], c[2]});
  }
  return w;
}

std::string ranks_line(const WorldStep& w, bool meta) {
  std::string line = engine::str("ranks: peak ", format_bytes(size_t(w.peak[w.largest])), " (rank ", w.largest, ") .. ",
                                 format_bytes(size_t(w.peak[w.smallest])), " (rank ", w.smallest, ")");
  if (!meta) line += engine::str(" | slowest rank ", w.slowest, ": ", format_fixed(w.ms[w.slowest], 1), " ms");
  for (const WorldStep::Collective& c : w.collectives) {
    if (c.calls == 0) continue;
    line += engine::str(" | ", c.name, " ", int64_t(c.bytes), " B (", format_bytes(size_t(c.bytes)), ") in ",
                        int64_t(c.calls), c.calls == 1 ? " call" : " calls");
    if (meta || c.seconds <= 0) continue;
    line += engine::str(", ", format_fixed(c.seconds * 1000, 2), " ms: ", format_fixed(w.algbw(c), 2), " GB/s, bus ",
                        format_fixed(w.busbw(c), 2), " GB/s");
  }
  return line;
}

std::string ranks_json(const WorldStep& w, bool meta) {
  using engine::json::number;
  std::ostringstream os;
  auto list = [&](const std::vector<double>& v, bool times) {
    os << "[";
    for (size_t r = 0; r < v.size(); r++) os << (r ? ", " : "") << (times && meta ? "null" : number(v[r]));
    os << "]";
  };
  os << "{\"peak_bytes\": ";
  list(w.peak, false);
  os << ", \"ms\": ";
  list(w.ms, true);
  os << ", \"slowest_rank\": " << (meta ? "null" : std::to_string(w.slowest));
  for (const WorldStep::Collective& c : w.collectives) {
    const bool timed = !meta && c.seconds > 0;
    const char* key = std::string(c.name) == "all-reduce" ? "all_reduce" : c.name;
    os << ", \"" << key << "\": {\"calls\": " << int64_t(c.calls) << ", \"bytes\": " << number(c.bytes)
       << ", \"seconds\": " << (timed ? number(c.seconds) : "null")
       << ", \"bus_gb_per_s\": " << (timed ? number(w.busbw(c)) : "null") << "}";
  }
  os << "}";
  return os.str();
}

}  // namespace tools
