// optim_cuda_test.cpp: the fused optimizer updates on the GPU against the cpu reference over several steps
// (every option: momentum, dampening, Nesterov, weight decay L2 / decoupled, centered, TensorFlow-style
// RMSProp), in f32, f64 and bf16, on vector-aligned, odd-length and misaligned tensors; squared_norms and
// clip_grad_norm (deterministic f64 sums); an Adam optimizer stepping on the GPU; the ledger equal to meta's.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <utility>

#include "graph/autograd.h"
#include "ops/elementwise.h"
#include "ops/factory.h"
#include "ops/optimizer.h"
#include "ops/view.h"
#include "tests/util/cuda_compare_util.h"

using engine::DType;
using engine::Shape;
using engine::Tensor;
using testutil::cpu_input;
using testutil::to_cuda;
using testutil::Tolerance;

using testutil::median_ms;

namespace {

struct Layout {
  const char* name;
  int64_t n;
  bool misalign;  // every tensor starts one element into its storage (contiguous, not 16-byte aligned)
};
const Layout kLayouts[] = {
    {"aligned", 4096, false}, {"odd length (scalar tail)", 1001, false}, {"misaligned", 777, true}};

// A contiguous [n] tensor with values in [low, high), possibly one element into its storage.
Tensor make(const Layout& l, DType dt, double low, double high) {
  if (!l.misalign) return cpu_input({l.n}, dt, low, high);
  return ops::slice(cpu_input({l.n + 1}, dt, low, high), 0, 1, l.n + 1);
}

Tolerance update_tolerance(DType dt) {
  // One ulp or two per step where the GPU fuses a multiply-add; bf16 state rounds the same way on both.
  return dt == DType::f32 ? Tolerance{1e-6, 1e-5} : testutil::tolerance_for(dt);
}

using Range = std::pair<double, double>;

// Runs `update(ParamUpdates, step)` for 3 steps on cpu tensors and on cuda copies, one list of every layout
// (one kernel launch on cuda: aligned and misaligned parameters side by side); compares params and slots.
// Slot k starts uniform in slot_ranges[k]: realistic states (second moments positive and, for centered
// RMSProp, above the squared mean, so that no result hangs on a cancellation).
void expect_update_matches(const std::string& what, DType dt, const std::vector<Range>& slot_ranges,
                           const std::function<void(const ops::ParamUpdates&, int)>& update) {
  const size_t num_slots = slot_ranges.size();
  ops::ParamUpdates cpu, gpu;
  for (const Layout& l : kLayouts) {
    ops::ParamUpdate c{make(l, dt, -1, 1), make(l, dt, -1, 1), {}, Tensor()};
    for (const Range& r : slot_ranges) c.slots.push_back(make(l, dt, r.first, r.second));
    ops::ParamUpdate g{to_cuda(c.param), to_cuda(c.grad), {}, Tensor()};
    for (const Tensor& s : c.slots) g.slots.push_back(to_cuda(s));
    if (l.misalign) {  // re-create the misaligned views on the GPU
      auto shifted = [](const Tensor& t) {
        Tensor big = to_cuda(ops::zeros({t.numel() + 1}, t.dtype()));
        engine::DeviceGuard guard(testutil::cuda_device());
        Tensor v = ops::slice(big, 0, 1, t.numel() + 1);
        ops::copy_(v, to_cuda(t));
        return v;
      };
      g.param = shifted(c.param);
      g.grad = shifted(c.grad);
      for (size_t k = 0; k < g.slots.size(); k++) g.slots[k] = shifted(c.slots[k]);
    }
    cpu.push_back(c);
    gpu.push_back(g);
  }
  for (int step = 1; step <= 3; step++) {
    update(cpu, step);
    {
      engine::DeviceGuard guard(testutil::cuda_device());
      update(gpu, step);
    }
    for (size_t i = 0; i < cpu.size(); i++) {
      std::string at = engine::str(what, " ", engine::dtype_name(dt), " ", kLayouts[i].name, " step ", step);
      testutil::expect_close(at + ": param", cpu[i].param, gpu[i].param, update_tolerance(dt));
      for (size_t k = 0; k < num_slots; k++)
        testutil::expect_close(engine::str(at, ": slot ", k), cpu[i].slots[k], gpu[i].slots[k], update_tolerance(dt));
    }
  }
}

const DType kDtypes[] = {DType::f32, DType::f64, DType::bf16};

}  // namespace

TEST(OptimCuda, SgdMatchesCpu) {
  for (DType dt : kDtypes) {
    expect_update_matches("sgd plain", dt, {}, [](const ops::ParamUpdates& t, int) { ops::sgd_update(t, {0.1}); });
    for (bool nesterov : {false, true}) {
      expect_update_matches(nesterov ? "sgd nesterov" : "sgd momentum+dampening+wd", dt, {{-0.5, 0.5}},
                            [nesterov](const ops::ParamUpdates& t, int step) {
                              ops::SgdStep h{0.05 * step, 0.9, nesterov ? 0.0 : 0.1, 0.01, nesterov, step == 1};
                              ops::sgd_update(t, h);
                            });
    }
  }
}

TEST(OptimCuda, AdamAndAdamWMatchCpu) {
  for (DType dt : kDtypes) {
    for (bool decoupled : {false, true}) {
      expect_update_matches(decoupled ? "adamw" : "adam l2", dt, {{-0.5, 0.5}, {0, 0.5}},
                            [decoupled](const ops::ParamUpdates& t, int step) {
                              ops::AdamStep h;
                              h.lr = 1e-3 * step;
                              h.weight_decay = 0.01;
                              h.decoupled_weight_decay = decoupled;
                              h.step = step;
                              ops::adam_update(t, h);
                            });
    }
  }
}

TEST(OptimCuda, AdamaxMatchesCpu) {
  for (DType dt : kDtypes)
    expect_update_matches("adamax", dt, {{-0.5, 0.5}, {0, 0.5}}, [](const ops::ParamUpdates& t, int step) {
      ops::AdamaxStep h;
      h.lr = 2e-3;
      h.weight_decay = 0.02;
      h.step = step;
      ops::adamax_update(t, h);
    });
}

TEST(OptimCuda, RmsPropMatchesCpu) {
  for (DType dt : kDtypes) {
    for (bool tf : {false, true}) {
      for (bool centered : {false, true}) {
        for (double momentum : {0.0, 0.9}) {
          // square_avg in [1, 2), momentum_buffer and grad_avg in [-0.5, 0.5): square_avg > grad_avg^2.
          std::vector<Range> slots = {{1, 2}};
          if (momentum != 0) slots.push_back({-0.5, 0.5});
          if (centered) slots.push_back({-0.5, 0.5});
          std::string what =
              engine::str("rmsprop", tf ? " tf" : "", centered ? " centered" : "", momentum != 0 ? " momentum" : "");
          expect_update_matches(what, dt, slots, [=](const ops::ParamUpdates& t, int) {
            ops::RmsPropStep h{1e-2, 0.9, tf ? 1.0 : 1e-8, 1e-3, momentum, centered, tf};
            ops::rmsprop_update(t, h);
          });
        }
      }
    }
  }
}

// Mixed precision: bf16/f16 weight and gradient, f32 master and slots, gradient scale 1/1024 (fp16 loss
// scaling); aligned, odd-length (scalar tail) and misaligned (scalar kernel) tensors of both dtypes in one list
// (two runs of one type each on cuda), 3 Adam steps.
TEST(OptimCuda, MasterWeightUpdateMatchesCpu) {
  ops::ParamUpdates cpu, gpu;
  for (DType low : {DType::bf16, DType::f16}) {
    for (const Layout& l : kLayouts) {
      ops::ParamUpdate c{Tensor(),
                         make(l, low, -1, 1),
                         {make(l, DType::f32, -0.5, 0.5), make(l, DType::f32, 0, 0.5)},
                         make(l, DType::f32, -1, 1),
                         1.0 / 1024};
      c.param = ops::to(c.master, low);
      cpu.push_back(c);
      gpu.push_back(ops::ParamUpdate{to_cuda(c.param),
                                     to_cuda(c.grad),
                                     {to_cuda(c.slots[0]), to_cuda(c.slots[1])},
                                     to_cuda(c.master),
                                     c.grad_scale});
    }
  }
  for (int step = 1; step <= 3; step++) {
    ops::AdamStep h;
    h.lr = 1e-2;
    h.weight_decay = 0.01;
    h.decoupled_weight_decay = true;
    h.step = step;
    ops::adam_update(cpu, h);
    {
      engine::DeviceGuard guard(testutil::cuda_device());
      ops::adam_update(gpu, h);
    }
    for (size_t i = 0; i < cpu.size(); i++) {
      const DType low = cpu[i].param.dtype();
      std::string at = engine::str("adamw master ", engine::dtype_name(low), " ", kLayouts[i % 3].name, " step ", step);
      testutil::expect_close(at + ": master", cpu[i].master, gpu[i].master, update_tolerance(DType::f32));
      testutil::expect_close(at + ": exp_avg_sq", cpu[i].slots[1], gpu[i].slots[1], update_tolerance(DType::f32));
      testutil::expect_close(at + ": weight", cpu[i].param, gpu[i].param, testutil::tolerance_for(low));
    }
  }
}

// The multi-tensor launch's bookkeeping: 110 parameters (more than the 48 of one launch, so three launches per
// run), sizes from empty to several 65536-element chunks, f32 parameters and bf16 ones with a master weight
// interleaved in runs; one TF-style RMSProp update (NASNet's) of the whole list against the cpu, parameter by
// parameter.
TEST(OptimCuda, ManyParametersInOneUpdate) {
  ops::ParamUpdates cpu, gpu;
  const int64_t sizes[] = {0, 1, 7, 168, 4096, 65535, 65536, 65537, 200003};
  for (int i = 0; i < 110; i++) {
    const int64_t n = sizes[i % 9];
    const bool mixed = (i / 10) % 2 == 1;  // runs of 10
    ops::ParamUpdate c;
    if (mixed) {
      c.master = cpu_input({n}, DType::f32, -1, 1);
      c.param = ops::to(c.master, DType::bf16);
      c.grad = cpu_input({n}, DType::bf16, -1, 1);
    } else {
      c.param = cpu_input({n}, DType::f32, -1, 1);
      c.grad = cpu_input({n}, DType::f32, -1, 1);
    }
    c.slots = {cpu_input({n}, DType::f32, 1, 2), cpu_input({n}, DType::f32, -0.5, 0.5)};
    cpu.push_back(c);
    ops::ParamUpdate g{to_cuda(c.param), to_cuda(c.grad), {to_cuda(c.slots[0]), to_cuda(c.slots[1])}, Tensor()};
    if (mixed) g.master = to_cuda(c.master);
    gpu.push_back(g);
  }
  const ops::RmsPropStep h{0.1, 0.9, 1.0, 1e-4, 0.9, false, true};
  ops::rmsprop_update(cpu, h);
  {
    engine::DeviceGuard guard(testutil::cuda_device());
    ops::rmsprop_update(gpu, h);
  }
  for (size_t i = 0; i < cpu.size(); i++) {
    const std::string at = engine::str("parameter ", i, " [", cpu[i].param.numel(), "]");
    const bool mixed = cpu[i].master.defined();
    testutil::expect_close(at + ": weight", cpu[i].param, gpu[i].param,
                           mixed ? testutil::tolerance_for(DType::bf16) : update_tolerance(DType::f32));
    if (mixed) testutil::expect_close(at + ": master", cpu[i].master, gpu[i].master, update_tolerance(DType::f32));
    for (size_t k = 0; k < 2; k++)
      testutil::expect_close(engine::str(at, ": slot ", k), cpu[i].slots[k], gpu[i].slots[k],
                             update_tolerance(DType::f32));
  }
}

TEST(OptimCuda, SquaredNormsAndClipGradNorm) {
  // Sizes around the 65536-element chunk, an empty tensor, mixed dtypes.
  std::vector<Tensor> xs = {cpu_input({65536}, DType::f32), cpu_input({3, 70001}, DType::f32),
                            cpu_input({0}, DType::f32), cpu_input({513}, DType::bf16), cpu_input({200000}, DType::f64)};
  std::vector<Tensor> gpu;
  for (const Tensor& x : xs) gpu.push_back(to_cuda(x));
  Tensor want = ops::squared_norms(xs), got;
  {
    engine::DeviceGuard guard(testutil::cuda_device());
    got = ops::squared_norms(gpu);
  }
  testutil::expect_close("squared_norms", want, got, Tolerance{1e-9, 1e-12});
  // Repeatable: the same bits twice.
  {
    engine::DeviceGuard guard(testutil::cuda_device());
    testutil::expect_equal("squared_norms run twice", got, ops::squared_norms(gpu));
  }
  // clip_grad_norm: same norm, same scaled gradients.
  std::vector<Tensor> cpu_params, gpu_params;
  for (const Shape& s : {Shape{300, 7}, Shape{1000}}) {
    Tensor p = cpu_input(s, DType::f32, -1, 1, true);
    p.set_grad(cpu_input(s, DType::f32, -1, 1));
    Tensor q = to_cuda(p);
    q.set_grad(to_cuda(p.grad()));
    cpu_params.push_back(p);
    gpu_params.push_back(q);
  }
  double n_cpu = ops::clip_grad_norm(cpu_params, 1.0), n_gpu;
  {
    engine::DeviceGuard guard(testutil::cuda_device());
    n_gpu = ops::clip_grad_norm(gpu_params, 1.0);
  }
  EXPECT_NEAR(n_gpu, n_cpu, 1e-9 * n_cpu);
  for (size_t k = 0; k < cpu_params.size(); k++)
    testutil::expect_close(engine::str("clipped gradient ", k), cpu_params[k].grad(), gpu_params[k].grad());
}

TEST(OptimCuda, ClipCoefficientIsTheCpusAndTheUpdateReadsItOnTheGpu) {
  // On the GPU, the coefficient computed there is the host's formula applied to the GPU's own norm to the bit, and
  // the cpu's within the squared norms' rounding (their sums are added in another order).
  Tensor p = cpu_input({300, 7}, DType::f32, -1, 1, true), r = cpu_input({1000}, DType::bf16, -1, 1, true);
  p.set_grad(cpu_input({300, 7}, DType::f32, -1, 1));
  r.set_grad(cpu_input({1000}, DType::bf16, -1, 1));
  Tensor q = to_cuda(p), s = to_cuda(r);
  q.set_grad(to_cuda(p.grad()));
  s.set_grad(to_cuda(r.grad()));
  for (double max_norm : {1.0, 1e6}) {
    const double cpu = ops::clip_coefficient({p, r}, max_norm).to_double()[0];
    engine::DeviceGuard guard(testutil::cuda_device());
    const double norm = ops::grad_norm({q, s}), host = norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
    const Tensor coef = ops::clip_coefficient({q, s}, max_norm);
    EXPECT_EQ(coef.to_double()[0], host) << max_norm;
    EXPECT_NEAR(coef.to_double()[0], cpu, 1e-12) << max_norm;
    if (max_norm == 1.0) {
      EXPECT_LT(host, 1.0);
    }
  }
  // AdamW on the GPU: the factor read from device memory, or the same number passed from the host: the same bits.
  auto step = [&](bool on_device) {
    Tensor w = to_cuda(p.detach());
    w.set_grad(q.grad());
    ops::AdamOptions o;
    o.lr = 1e-2;
    engine::DeviceGuard guard(testutil::cuda_device());
    ops::AdamW opt({{"w", w}}, o);
    const Tensor coef = ops::clip_coefficient({w}, 1.0);
    if (on_device)
      opt.set_grad_scale(1, coef);
    else
      opt.set_grad_scale(coef.to_double()[0]);
    opt.step();
    return w;
  };
  testutil::expect_equal("AdamW with the factor on the device", step(false), step(true));
}

TEST(OptimCuda, AdamOptimizerStepsOnTheGpu) {
  // The Optimizer class end to end: lazy slots on the parameter's device, three steps.
  Tensor p = cpu_input({64, 33}, DType::f32, -1, 1, true);
  Tensor q = to_cuda(p);
  ops::AdamOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  ops::AdamW cpu_opt({{"w", p}}, o), gpu_opt({{"w", q}}, o);
  for (int step = 0; step < 3; step++) {
    Tensor g = cpu_input({64, 33}, DType::f32, -1, 1);
    p.set_grad(g);
    q.set_grad(to_cuda(g));
    cpu_opt.step();
    engine::DeviceGuard guard(testutil::cuda_device());
    gpu_opt.step();
  }
  testutil::expect_close("AdamW parameter after 3 steps", p, q, update_tolerance(DType::f32));
}

TEST(OptimCuda, AdafactorMatchesCpuAndMeta) {
  // Adafactor is written with the engine's ops (reductions, pointwise): the same three steps on both devices,
  // a factored matrix, a factored 4-d weight and a vector, plain f32 and with a bf16 parameter and f32 master.
  for (bool mixed : {false, true}) {
    const std::vector<Shape> shapes = {{96, 33}, {8, 5, 3, 3}, {77}};
    ops::NamedTensors cpu, gpu;
    for (size_t k = 0; k < shapes.size(); k++) {
      Tensor p = cpu_input(shapes[k], mixed ? DType::bf16 : DType::f32, -1, 1, true);
      cpu.emplace_back("p" + std::to_string(k), p);
      gpu.emplace_back("p" + std::to_string(k), to_cuda(p).set_requires_grad(true));
    }
    ops::AdafactorOptions o;
    o.lr = 0.05;
    o.weight_decay = 0.01;
    ops::Adafactor cpu_opt(cpu, o), gpu_opt(gpu, o);
    if (mixed)
      for (size_t k = 0; k < shapes.size(); k++) {
        cpu_opt.set_master_weight(cpu[k].first, ops::to(cpu[k].second, DType::f32));
        engine::DeviceGuard guard(testutil::cuda_device());
        gpu_opt.set_master_weight(gpu[k].first, ops::to(gpu[k].second, DType::f32));
      }
    for (int step = 0; step < 3; step++) {
      for (size_t k = 0; k < shapes.size(); k++) {
        Tensor g = cpu_input(shapes[k], cpu[k].second.dtype(), -1, 1);
        cpu[k].second.set_grad(g);
        gpu[k].second.set_grad(to_cuda(g));
      }
      cpu_opt.step();
      engine::DeviceGuard guard(testutil::cuda_device());
      gpu_opt.step();
    }
    for (size_t k = 0; k < shapes.size(); k++) {
      const std::string at = engine::str("Adafactor", mixed ? " (bf16, f32 master) " : " ", cpu[k].first);
      const Tolerance tol = mixed ? testutil::tolerance_for(DType::bf16) : Tolerance{1e-5, 1e-5};
      testutil::expect_close(at, cpu[k].second, gpu[k].second, tol);
      if (mixed)
        testutil::expect_close(at + " master", cpu_opt.master_weight(cpu[k].first), gpu_opt.master_weight(gpu[k].first),
                               Tolerance{1e-5, 1e-5});
    }
  }
  testutil::expect_cuda_ledger_matches_meta([] {
    Tensor w = ops::rand({128, 40}, -1, 1, DType::f32).set_requires_grad(true);
    Tensor b = ops::rand({40}, -1, 1, DType::f32).set_requires_grad(true);
    ops::Adafactor opt({{"w", w}, {"b", b}}, ops::AdafactorOptions{});
    for (int step = 0; step < 2; step++) {
      w.set_grad(ops::rand({128, 40}, -1, 1, DType::f32));
      b.set_grad(ops::rand({40}, -1, 1, DType::f32));
      opt.step();
    }
  });
}

TEST(OptimCuda, LedgerMatchesMeta) {
  testutil::expect_cuda_ledger_matches_meta([] {
    Tensor p = ops::rand({128, 40}, -1, 1, DType::f32).set_requires_grad(true);
    Tensor b = ops::rand({40}, -1, 1, DType::f32).set_requires_grad(true);
    ops::Adam opt({{"w", p}, {"b", b}}, ops::AdamOptions{});
    for (int step = 0; step < 2; step++) {
      p.set_grad(ops::rand({128, 40}, -1, 1, DType::f32));
      b.set_grad(ops::rand({40}, -1, 1, DType::f32));
      ops::clip_grad_norm({p, b}, 0.5);
      opt.step();
    }
  });
}

// Not run by default (--gtest_also_run_disabled_tests): Adam over 64M parameters, squared norms.
TEST(OptimCuda, DISABLED_Bandwidth) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const int64_t n = int64_t(64) << 20;
    ops::ParamUpdate t{testutil::to_cuda(cpu_input({n}, dt)),
                       testutil::to_cuda(cpu_input({n}, dt)),
                       {testutil::to_cuda(cpu_input({n}, dt)), testutil::to_cuda(cpu_input({n}, dt, 0, 1))},
                       Tensor()};
    const double bytes = double(t.param.nbytes());
    ops::AdamStep h;
    h.lr = 1e-4;
    double adam = median_ms([&] { ops::adam_update({t}, h); });
    double norms = median_ms([&] { ops::squared_norms({t.param, t.grad}); });
    std::printf("adam %s [%ld]: %.3f ms %.0f GB/s; squared_norms of 2 x [%ld]: %.3f ms %.0f GB/s\n",
                engine::dtype_name(dt), long(n), adam, 7 * bytes / adam / 1e6, long(n), norms, 2 * bytes / norms / 1e6);
  }
  // NASNet-A Large's case: ~1000 parameters, most of them small (batch norm's 168-2016 channels), bf16 with f32
  // masters; one TF-style RMSProp update of the whole list (~50 launches) and the squared norms of the grads.
  const int64_t sizes[] = {168, 1512, 28224, 112896, 4200, 336, 2016, 56448};
  ops::ParamUpdates many;
  std::vector<Tensor> grads;
  int64_t elements = 0;
  for (int i = 0; i < 1000; i++) {
    const int64_t n = sizes[i % 8];
    elements += n;
    ops::ParamUpdate t{
        testutil::to_cuda(cpu_input({n}, DType::bf16)),
        testutil::to_cuda(cpu_input({n}, DType::bf16)),
        {testutil::to_cuda(cpu_input({n}, DType::f32, 1, 2)), testutil::to_cuda(cpu_input({n}, DType::f32))},
        testutil::to_cuda(cpu_input({n}, DType::f32))};
    grads.push_back(t.grad);
    many.push_back(t);
  }
  const ops::RmsPropStep h{0.01, 0.9, 1.0, 0, 0.9, false, true};
  const double rms = median_ms([&] { ops::rmsprop_update(many, h); });
  const double norms = median_ms([&] { ops::squared_norms(grads); });
  std::printf(
      "rmsprop (tf, bf16 + f32 masters) over 1000 tensors, %ld elements: %.3f ms %.0f GB/s; squared_norms of "
      "their bf16 grads: %.3f ms %.0f GB/s\n",
      long(elements), rms, double(elements) * 28 / rms / 1e6, norms, double(elements) * 2 / norms / 1e6);
}
