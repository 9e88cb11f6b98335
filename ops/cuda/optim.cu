// cuda/optim.cu: fused optimizer updates and the squared norms behind clip_grad_norm.
//
// Every update is one pass over a list of parameters, up to 48 per launch (multi_tensor_update): each block loads
// a chunk of one parameter, its gradient and up to S state slots (16-byte vectors when all are aligned, then a
// scalar tail), applies the optimizer's per-element math, and stores the parameter and the slots. Bytes per
// element: (3 + 2 S) x element size; bound: memory bandwidth.
// The per-element math (the *Math functors) repeats ops/cpu/optim.cpp expression for expression, with the
// same host-computed hyperparameters (double, converted once), so f32 results agree with the CPU to an ulp
// or two (the GPU may fuse a multiply-add).
#include <cmath>
#include <utility>
#include <vector>

#include "ops/cpu/optim.h"  // clip_coefficient_of (ENGINE_HD)
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/optim.h"

namespace ops::cuda {

using engine::Tensor;

namespace {

constexpr int kThreads = 256;

// The slots of one update: S pointers, nullptr for a slot this configuration does not use.
template <typename T, int S>
struct Slots {
  T* p[S > 0 ? S : 1];
};

// ---------------------------------------------------------------------------------------------------
// Per-element math. Each functor: operator()(A& param, A grad, A (&slots)[S]).

template <typename A>
struct SgdMath {
  A lr, wd, mom, keep;
  bool decay, momentum, nesterov, first_step;
  __device__ void operator()(A& p, A g, A (&s)[1]) const {
    A d = g;
    if (decay) d += wd * p;
    if (momentum) {
      const A b = first_step ? d : mom * s[0] + keep * d;
      s[0] = b;
      d = nesterov ? d + mom * b : b;
    }
    p = p - lr * d;
  }
};

template <typename A>
struct AdamMath {
  A step_size, bc2_sqrt, one_minus_b1, b2, one_minus_b2, eps, wd, decay;
  bool l2, decoupled;
  __device__ void operator()(A& p, A g, A (&s)[2]) const {  // s = {exp_avg, exp_avg_sq}
    if (l2) g += wd * p;
    if (decoupled) p *= decay;
    A m = s[0];
    m += one_minus_b1 * (g - m);
    const A v = b2 * s[1] + one_minus_b2 * g * g;
    s[0] = m;
    s[1] = v;
    p = p - step_size * m / (std::sqrt(v) / bc2_sqrt + eps);
  }
};

template <typename A>
struct AdamaxMath {
  A clr, one_minus_b1, b2, eps, wd;
  bool decay;
  __device__ void operator()(A& p, A g, A (&s)[2]) const {  // s = {exp_avg, exp_inf}
    if (decay) g += wd * p;
    A m = s[0];
    m += one_minus_b1 * (g - m);
    const A a = b2 * s[1], b = std::abs(g) + eps;
    const A u = a < b ? b : a;  // std::max's rule, as the CPU
    s[0] = m;
    s[1] = u;
    p = p - clr * m / u;
  }
};

template <typename A>
struct RmsPropMath {
  A lr, alpha, one_minus_alpha, eps, wd, mom;
  bool decay, momentum, centered, tf_style;
  __device__ void operator()(A& p, A g, A (&s)[3]) const {  // s = {square_avg, momentum_buffer, grad_avg}
    if (decay) g += wd * p;
    A v = s[0];
    A mean_sq = 0;
    if (tf_style) {
      v += (g * g - v) * one_minus_alpha;
      mean_sq = v;
      if (centered) {
        A ga = s[2];
        ga += (g - ga) * one_minus_alpha;
        s[2] = ga;
        mean_sq -= ga * ga;
      }
    } else {
      v = alpha * v + one_minus_alpha * g * g;
      mean_sq = v;
      if (centered) {
        A ga = s[2];
        ga += one_minus_alpha * (g - ga);
        s[2] = ga;
        mean_sq -= ga * ga;
      }
    }
    s[0] = v;
    if (tf_style) {
      A step = lr * g / std::sqrt(mean_sq + eps);
      if (momentum) {
        step += mom * s[1];
        s[1] = step;
      }
      p = p - step;
    } else {
      A scaled = g / (std::sqrt(mean_sq) + eps);
      if (momentum) {
        scaled += mom * s[1];
        s[1] = scaled;
      }
      p = p - lr * scaled;
    }
  }
};

// ---------------------------------------------------------------------------------------------------
// The fused multi-tensor pass. One launch updates up to kTensorsPerLaunch parameters, whose pointers travel in
// the kernel's parameter block (a __grid_constant__ table: no device memory, so the arena's accounting is
// unchanged); each block takes one chunk of kUpdateChunk elements of one parameter. T is the weight's and the
// slots' type, G the gradient's: T = G, or (mixed precision) T = f32 master weights with G = bf16/f16, when
// the new weight is also stored, rounded, into `low` (the parameter the model computes with). Bytes per
// element: T weights and slots (2 + 2 S) x sizeof(T), plus the gradient read (and the low copy written).
constexpr int kTensorsPerLaunch = 48;  // with S = 3: a 3.3 KB table, inside the classic 4 KB parameter limit
// Elements per block: 8 passes of 256 threads x 4 f32. A launch of ~48 small parameters still has a few hundred
// blocks (65536 elements per block left such a launch latency-bound: 0.43 TB/s over NASNet's parameter list).
constexpr int64_t kUpdateChunk = int64_t(1) << 13;

template <typename T, typename G, int S>
struct UpdateTable {
  T* weight[kTensorsPerLaunch];
  const G* grad[kTensorsPerLaunch];
  G* low[kTensorsPerLaunch];  // the bf16/f16 parameter under a master weight, else nullptr
  Slots<T, S> slots[kTensorsPerLaunch];
  int64_t numel[kTensorsPerLaunch];
  acc_t<T> grad_scale[kTensorsPerLaunch];
  const double* scale_by;  // ParamUpdate::scale_by's element 0 (one factor per launch) in place of grad_scale, or null
  int first_block[kTensorsPerLaunch + 1];  // cumulative chunk counts: parameter k owns blocks [first, next)
  bool aligned[kTensorsPerLaunch];         // every pointer of parameter k 16-byte aligned: vector loads
  int count;
};

// Elements [begin, end) of one parameter, by one block: VEC elements per thread and pass (begin is a multiple
// of kUpdateChunk, so vectors stay aligned), then the elements past the last whole vector one per thread.
// Slots that are nullptr are neither loaded nor stored.
template <typename T, typename G, int S, int VEC, typename F>
__device__ void update_range(T* __restrict__ p, const G* __restrict__ g, G* __restrict__ low, const Slots<T, S>& slots,
                             int64_t begin, int64_t end, acc_t<T> grad_scale, const F& f) {
  using A = acc_t<T>;
  constexpr int SA = S > 0 ? S : 1;
  const int64_t vectors_end = begin + (end - begin) / VEC * VEC;
  for (int64_t i = begin + int64_t(threadIdx.x) * VEC; i < vectors_end; i += int64_t(blockDim.x) * VEC) {
    A pv[VEC], gv[VEC], sv[SA][VEC] = {};
    load_vec<VEC>(p + i, pv);
    load_vec<VEC>(g + i, gv);
#pragma unroll
    for (int s = 0; s < S; s++)
      if (slots.p[s]) load_vec<VEC>(slots.p[s] + i, sv[s]);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      A sk[SA];
#pragma unroll
      for (int s = 0; s < SA; s++) sk[s] = sv[s][k];
      f(pv[k], gv[k] * grad_scale, sk);
#pragma unroll
      for (int s = 0; s < SA; s++) sv[s][k] = sk[s];
    }
    store_vec<VEC>(p + i, pv);
    if (low) store_vec<VEC>(low + i, pv);
#pragma unroll
    for (int s = 0; s < S; s++)
      if (slots.p[s]) store_vec<VEC>(slots.p[s] + i, sv[s]);
  }
  for (int64_t i = vectors_end + threadIdx.x; i < end; i += blockDim.x) {
    A pi = to_acc<A>(p[i]), sk[SA] = {};
#pragma unroll
    for (int s = 0; s < S; s++)
      if (slots.p[s]) sk[s] = to_acc<A>(slots.p[s][i]);
    f(pi, A(to_acc<acc_t<G>>(g[i])) * grad_scale, sk);
    p[i] = from_acc<T>(pi);
    if (low) low[i] = from_acc<G>(pi);
#pragma unroll
    for (int s = 0; s < S; s++)
      if (slots.p[s]) slots.p[s][i] = from_acc<T>(sk[s]);
  }
}

template <typename T, typename G, int S, typename F>
__global__ void __launch_bounds__(kThreads)
    multi_tensor_update(const __grid_constant__ UpdateTable<T, G, S> table, const F f) {
  int k = 0;  // the parameter this block works on: a scan of at most 48 entries
  while (k + 1 < table.count && table.first_block[k + 1] <= int(blockIdx.x)) k++;
  const int64_t begin = int64_t(int(blockIdx.x) - table.first_block[k]) * kUpdateChunk;
  const int64_t end = min(table.numel[k], begin + kUpdateChunk);
  const acc_t<T> grad_scale = table.scale_by ? acc_t<T>(*table.scale_by) : table.grad_scale[k];
  if (table.aligned[k])
    update_range<T, G, S, vec16<T>()>(table.weight[k], table.grad[k], table.low[k], table.slots[k], begin, end,
                                      grad_scale, f);
  else
    update_range<T, G, S, 1>(table.weight[k], table.grad[k], table.low[k], table.slots[k], begin, end, grad_scale, f);
}

// Launches multi_tensor_update over ts[first, last), which share T and G, kTensorsPerLaunch parameters at a time;
// slots_of(t) gives one parameter's slot pointers. The weight is t.master when defined (then G is the
// parameter's dtype), else t.param (G = T). T is the wider type: vec16<T>() elements of G are <= 16 bytes.
template <typename T, typename G, int S, typename SlotsOf, typename F>
void launch_updates(const ParamUpdates& ts, size_t first, size_t last, const SlotsOf& slots_of, const F& f) {
  cudaStream_t stream = engine::cuda::stream();
  while (first < last) {
    UpdateTable<T, G, S> table{};
    table.scale_by = ts[first].scale_by.defined() ? static_cast<const double*>(ts[first].scale_by.data_ptr()) : nullptr;
    for (; first < last && table.count < kTensorsPerLaunch; first++) {
      const ParamUpdate& t = ts[first];
      ENGINE_CHECK(
          (t.scale_by.defined() ? static_cast<const double*>(t.scale_by.data_ptr()) : nullptr) == table.scale_by,
          "optimizer update: the parameters of one update op must share their scale_by factor");
      const int k = table.count++;
      table.weight[k] = static_cast<T*>((t.master.defined() ? t.master : t.param).data_ptr());
      table.grad[k] = static_cast<const G*>(t.grad.data_ptr());
      table.low[k] = t.master.defined() ? static_cast<G*>(t.param.data_ptr()) : nullptr;
      table.slots[k] = slots_of(t);
      table.numel[k] = t.param.numel();
      table.grad_scale[k] = acc_t<T>(t.grad_scale);
      const int64_t blocks = table.first_block[k] + (t.param.numel() + kUpdateChunk - 1) / kUpdateChunk;
      ENGINE_CHECK(blocks < (int64_t(1) << 31), "optimizer update: too many elements in one launch");
      table.first_block[k + 1] = int(blocks);
      bool aligned =
          aligned16(table.weight[k]) && aligned16(table.grad[k]) && (!table.low[k] || aligned16(table.low[k]));
      for (int s = 0; s < S; s++) aligned = aligned && (!table.slots[k].p[s] || aligned16(table.slots[k].p[s]));
      table.aligned[k] = aligned;
    }
    const int blocks = table.first_block[table.count];
    if (blocks > 0) multi_tensor_update<T, G, S, F><<<unsigned(blocks), kThreads, 0, stream>>>(table, f);
  }
}

// T = G = the parameter's dtype, or T = f32 and G = the parameter's dtype under a master copy.
#define CUDA_OPTIM_SWITCH(t, ...)                      \
  do {                                                 \
    if ((t).master.defined()) {                        \
      ENGINE_CUDA_FLOAT_SWITCH((t).param.dtype(), G, { \
        using T = float;                               \
        __VA_ARGS__;                                   \
      });                                              \
    } else {                                           \
      ENGINE_CUDA_FLOAT_SWITCH((t).param.dtype(), T, { \
        using G = T;                                   \
        __VA_ARGS__;                                   \
      });                                              \
    }                                                  \
  } while (0)

// The runs [first, last) of consecutive updates with one parameter dtype and master-or-not (so one T and G).
std::vector<std::pair<size_t, size_t>> type_runs(const ParamUpdates& ts) {
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t first = 0, last; first < ts.size(); first = last) {
    for (last = first + 1; last < ts.size() && ts[last].param.dtype() == ts[first].param.dtype() &&
                           ts[last].master.defined() == ts[first].master.defined();
         last++) {}
    runs.emplace_back(first, last);
  }
  return runs;
}

template <typename T>
T* slot_ptr(const ParamUpdate& t, size_t k) {
  return static_cast<T*>(t.slots[k].data_ptr());
}

// ---------------------------------------------------------------------------------------------------
// Squared norms

// Up to kTensorsPerLaunch tensors per launch, passed by value (a __grid_constant__ parameter).
struct NormTable {
  const void* ptr[kTensorsPerLaunch];
  int64_t numel[kTensorsPerLaunch];
  int64_t first_chunk[kTensorsPerLaunch + 1];  // chunk numbers of this launch, cumulative (relative)
  engine::DType dtype[kTensorsPerLaunch];
  bool aligned[kTensorsPerLaunch];  // 16-byte aligned: vector loads
  int count;
};
// Stage 1's threads per block: a 65536-element chunk is then 16 vectors of 8 bf16 (or 32 of 4 f32) per thread.
constexpr int kNormThreads = 512;

// The f64 sum of squares of x[begin, end), by one block: 16-byte vectors when the tensor is aligned (begin is a
// multiple of kNormChunk), four of them in flight per thread, then the tail one element per thread. Each thread's
// order is fixed: deterministic.
template <typename T>
__device__ double chunk_squares(const void* p, bool aligned, int64_t begin, int64_t end) {
  using A = acc_t<T>;
  constexpr int V = vec16<T>();
  const T* x = static_cast<const T*>(p);
  double s[4] = {};
  const int64_t vec_end = aligned ? begin + (end - begin) / V * V : begin, step = int64_t(blockDim.x) * V;
  int64_t i = begin + int64_t(threadIdx.x) * V;
  for (; i + 3 * step < vec_end; i += 4 * step) {
#pragma unroll
    for (int u = 0; u < 4; u++) {
      A v[V];
      load_vec<V>(x + i + u * step, v);
#pragma unroll
      for (int k = 0; k < V; k++) s[u] += double(v[k]) * double(v[k]);
    }
  }
  for (; i < vec_end; i += step) {
    A v[V];
    load_vec<V>(x + i, v);
#pragma unroll
    for (int k = 0; k < V; k++) s[0] += double(v[k]) * double(v[k]);
  }
  for (int64_t j = vec_end + threadIdx.x; j < end; j += blockDim.x) {
    const double v = double(to_acc<A>(x[j]));
    s[0] += v * v;
  }
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// Stage 1: block = one chunk of one tensor (found by a scan of the table); its f64 sum of squares goes to
// partials[chunk]. Bytes: one read per element; bound: memory.
__global__ void __launch_bounds__(kNormThreads)
    squared_norm_chunks(const __grid_constant__ NormTable table, double* __restrict__ partials) {
  __shared__ double scratch[32];
  const int64_t chunk = blockIdx.x;
  int k = 0;
  while (k + 1 < table.count && table.first_chunk[k + 1] <= chunk) k++;
  const int64_t begin = (chunk - table.first_chunk[k]) * kNormChunk;
  const int64_t end = min(table.numel[k], begin + kNormChunk);
  const bool aligned = table.aligned[k];
  double s = 0;
  switch (table.dtype[k]) {
    case engine::DType::f32:
      s = chunk_squares<float>(table.ptr[k], aligned, begin, end);
      break;
    case engine::DType::f64:
      s = chunk_squares<double>(table.ptr[k], aligned, begin, end);
      break;
    case engine::DType::bf16:
      s = chunk_squares<__nv_bfloat16>(table.ptr[k], aligned, begin, end);
      break;
    case engine::DType::f16:
      s = chunk_squares<__half>(table.ptr[k], aligned, begin, end);
      break;
    default:
      break;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partials[chunk] = s;
}

// Stage 2: block k adds tensor k's chunk sums (fixed tree) into out[k].
__global__ void __launch_bounds__(kThreads)
    squared_norm_totals(const __grid_constant__ NormTable table, const double* __restrict__ partials,
                        double* __restrict__ out) {
  __shared__ double scratch[32];
  const int k = blockIdx.x;
  double s = 0;
  for (int64_t c = table.first_chunk[k] + threadIdx.x; c < table.first_chunk[k + 1]; c += blockDim.x) s += partials[c];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) out[k] = s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------

void sgd_update(const ParamUpdates& ts, const SgdStep& h) {
  for (const auto& [first, last] : type_runs(ts)) {
    CUDA_OPTIM_SWITCH(ts[first], {
      using A = acc_t<T>;
      const bool momentum = h.momentum != 0;
      SgdMath<A> f{A(h.lr),  A(h.weight_decay), A(h.momentum), A(1 - h.dampening), h.weight_decay != 0,
                   momentum, h.nesterov,        h.first_step};
      launch_updates<T, G, 1>(
          ts, first, last, [&](const ParamUpdate& t) { return Slots<T, 1>{{momentum ? slot_ptr<T>(t, 0) : nullptr}}; },
          f);
    });
  }
  ENGINE_CUDA_LAUNCH_CHECK("sgd");
}

void adam_update(const ParamUpdates& ts, const AdamStep& h) {
  for (const auto& [first, last] : type_runs(ts)) {
    CUDA_OPTIM_SWITCH(ts[first], {
      using A = acc_t<T>;
      const double step = double(h.step);
      AdamMath<A> f{A(h.lr / (1 - std::pow(h.beta1, step))),
                    A(std::sqrt(1 - std::pow(h.beta2, step))),
                    A(1 - h.beta1),
                    A(h.beta2),
                    A(1 - h.beta2),
                    A(h.eps),
                    A(h.weight_decay),
                    A(1 - h.lr * h.weight_decay),
                    h.weight_decay != 0 && !h.decoupled_weight_decay,
                    h.weight_decay != 0 && h.decoupled_weight_decay};
      launch_updates<T, G, 2>(
          ts, first, last,
          [](const ParamUpdate& t) {
            return Slots<T, 2>{{slot_ptr<T>(t, 0), slot_ptr<T>(t, 1)}};
          },
          f);
    });
  }
  ENGINE_CUDA_LAUNCH_CHECK("adam");
}

void adamax_update(const ParamUpdates& ts, const AdamaxStep& h) {
  for (const auto& [first, last] : type_runs(ts)) {
    CUDA_OPTIM_SWITCH(ts[first], {
      using A = acc_t<T>;
      AdamaxMath<A> f{A(h.lr / (1 - std::pow(h.beta1, double(h.step)))),
                      A(1 - h.beta1),
                      A(h.beta2),
                      A(h.eps),
                      A(h.weight_decay),
                      h.weight_decay != 0};
      launch_updates<T, G, 2>(
          ts, first, last,
          [](const ParamUpdate& t) {
            return Slots<T, 2>{{slot_ptr<T>(t, 0), slot_ptr<T>(t, 1)}};
          },
          f);
    });
  }
  ENGINE_CUDA_LAUNCH_CHECK("adamax");
}

void rmsprop_update(const ParamUpdates& ts, const RmsPropStep& h) {
  for (const auto& [first, last] : type_runs(ts)) {
    CUDA_OPTIM_SWITCH(ts[first], {
      using A = acc_t<T>;
      const bool momentum = h.momentum != 0;
      RmsPropMath<A> f{A(h.lr),       A(h.alpha),          A(1 - h.alpha), A(h.eps),   A(h.weight_decay),
                       A(h.momentum), h.weight_decay != 0, momentum,       h.centered, h.tf_style};
      launch_updates<T, G, 3>(
          ts, first, last,
          [&](const ParamUpdate& t) {
            size_t k = 1;  // slots: {square_avg, [momentum_buffer], [grad_avg]}
            T* buf = momentum ? slot_ptr<T>(t, k++) : nullptr;
            T* grad_avg = h.centered ? slot_ptr<T>(t, k++) : nullptr;
            return Slots<T, 3>{{slot_ptr<T>(t, 0), buf, grad_avg}};
          },
          f);
    });
  }
  ENGINE_CUDA_LAUNCH_CHECK("rmsprop");
}

namespace {
__global__ void clip_coefficient_kernel(double* sums, int64_t n, double max_norm) {
  sums[0] = cpu::clip_coefficient_of(sums, n, max_norm);
}
}  // namespace

void clip_coefficient(const Tensor& sums, double max_norm) {
  clip_coefficient_kernel<<<1, 1, 0, engine::cuda::stream()>>>(static_cast<double*>(sums.data_ptr()), sums.numel(),
                                                               max_norm);
  ENGINE_CUDA_LAUNCH_CHECK("clip_coefficient");
}

void squared_norms(const std::vector<Tensor>& xs, const Tensor& out, const Tensor& partials) {
  int64_t chunks = 0;
  for (const Tensor& x : xs) chunks += (x.numel() + kNormChunk - 1) / kNormChunk;
  ENGINE_CHECK(partials.defined() && partials.numel() == chunks && partials.dtype() == engine::DType::f64,
               "squared_norms: cuda needs an f64 workspace of ", chunks, " partial sums (one per ", kNormChunk,
               " elements of each tensor)");
  cudaStream_t stream = engine::cuda::stream();
  double* pp = static_cast<double*>(partials.data_ptr());
  double* po = static_cast<double*>(out.data_ptr());
  for (size_t first = 0; first < xs.size(); first += kTensorsPerLaunch) {
    NormTable table{};
    table.count = int(std::min<size_t>(kTensorsPerLaunch, xs.size() - first));
    for (int k = 0; k < table.count; k++) {
      const Tensor& x = xs[first + size_t(k)];
      table.ptr[k] = x.data_ptr();
      table.numel[k] = x.numel();
      table.dtype[k] = x.dtype();
      table.aligned[k] = aligned16(x.data_ptr());
      table.first_chunk[k + 1] = table.first_chunk[k] + (x.numel() + kNormChunk - 1) / kNormChunk;
    }
    const int64_t launch_chunks = table.first_chunk[table.count];
    if (launch_chunks > 0) {
      squared_norm_chunks<<<unsigned(launch_chunks), kNormThreads, 0, stream>>>(table, pp);
      ENGINE_CUDA_LAUNCH_CHECK("squared_norms (chunks)");
    }
    squared_norm_totals<<<unsigned(table.count), kThreads, 0, stream>>>(table, pp, po + first);
    ENGINE_CUDA_LAUNCH_CHECK("squared_norms");
    pp += launch_chunks;
  }
}

}  // namespace ops::cuda
