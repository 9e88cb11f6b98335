// gloo_communicator.cpp: the Gloo plugin (build/libengine_gloo.so): cpu ranks' collectives through Gloo.
//
// Built as its own shared library, linked with Debian's libgloo (and through it hiredis and ibverbs), and loaded by
// engine/dist.cpp with dlopen when a cpu world of more than one rank is asked for: the engine's programs do not
// depend on Gloo otherwise (the GPU machine has no Gloo). It uses nothing of the engine but the HostCollectives
// interface of engine/dist.h.
//
// Rendezvous: Gloo's FileStore in the world's shared directory (each rank writes its TCP address there, then every
// pair connects: Gloo's full mesh). Sums: Gloo's ring all-reduce for f32 and f64 with its own sum functions; bf16
// and f16 through a sum that widens each pair to f32 and rounds back to nearest even, the same on every rank.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include <unistd.h>

#include "engine/dist.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/types.h"

namespace {

using engine::dist::HostCollectives;

float bf16_to_float(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

void sum_bf16(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<uint16_t*>(out);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; i++) o[i] = float_to_bf16(bf16_to_float(x[i]) + bf16_to_float(y[i]));
}

void sum_f16(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<gloo::float16*>(out);
  const auto* x = static_cast<const gloo::float16*>(a);
  const auto* y = static_cast<const gloo::float16*>(b);
  for (size_t i = 0; i < n; i++)
    o[i] = gloo::cpu_float2half_rn(gloo::cpu_half2float(x[i]) + gloo::cpu_half2float(y[i]));
}

class GlooCollectives : public HostCollectives {
 public:
  explicit GlooCollectives(std::shared_ptr<gloo::rendezvous::Context> context) : context_(std::move(context)) {}

  void all_reduce_sum(void* data, size_t count, Kind kind) override {
    if (count == 0) return;
    gloo::AllreduceOptions opts(context_);
    opts.setTag(next_tag());
    switch (kind) {
      case f32:
        opts.setOutput(static_cast<float*>(data), count);
        opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        break;
      case f64:
        opts.setOutput(static_cast<double*>(data), count);
        opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<double>));
        break;
      case bf16:
        opts.setOutput(static_cast<uint16_t*>(data), count);
        opts.setReduceFunction(&sum_bf16);
        break;
      case f16:
        opts.setOutput(static_cast<gloo::float16*>(data), count);
        opts.setReduceFunction(&sum_f16);
        break;
    }
    gloo::allreduce(opts);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    if (bytes == 0) return;
    gloo::BroadcastOptions opts(context_);
    opts.setTag(next_tag());
    opts.setRoot(root);
    opts.setOutput(static_cast<uint8_t*>(data), bytes);
    gloo::broadcast(opts);
  }

  void barrier() override {
    gloo::BarrierOptions opts(context_);
    opts.setTag(next_tag());
    gloo::barrier(opts);
  }

 private:
  uint32_t next_tag() { return tag_++; }  // every rank calls the same collectives in the same order
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint32_t tag_ = 1;
};

}  // namespace

extern "C" HostCollectives* engine_gloo_connect(int rank, int world_size, const char* store_dir, const char* host,
                                                std::string* error) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = host && *host ? host : "";
    if (attr.hostname.empty()) {
      char name[256] = {0};
      gethostname(name, sizeof name - 1);
      attr.hostname = name;
    }
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(store_dir);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
    // Long enough for the slowest rank's step between two collectives on a small machine; a rank that died is
    // noticed sooner by engine_train --nproc, which stops the others.
    context->setTimeout(std::chrono::minutes(10));
    context->connectFullMesh(store, device);
    return new GlooCollectives(std::move(context));
  } catch (const std::exception& e) {
    *error = e.what();
    return nullptr;
  }
}
