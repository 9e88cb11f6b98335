// cuda/optim.cu: fused optimizer updates and the squared norms behind clip_grad_norm.
//
// Every update is one pass: fused_update loads the parameter, its gradient and up to S state slots (16-byte
// vectors when all are aligned, then a scalar tail), applies the optimizer's per-element math, and stores
// the parameter and the slots. Bytes per element: (3 + 2 S) x element size; bound: memory bandwidth.
// The per-element math (the *Math functors) repeats ops/cpu/optim.cpp expression for expression, with the
// same host-computed hyperparameters (double, converted once), so f32 results agree with the CPU to an ulp
// or two (the GPU may fuse a multiply-add).
#include <cmath>

#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/optim.h"

namespace ops::cuda {

using engine::Tensor;

namespace {

constexpr int kThreads = 256;

// The slots of one update: S pointers, nullptr for a slot this configuration does not use.
template <typename T, int S> struct Slots { T* p[S > 0 ? S : 1]; };

// ---------------------------------------------------------------------------------------------------
// Per-element math. Each functor: operator()(A& param, A grad, A (&slots)[S]).

template <typename A> struct SgdMath {
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

template <typename A> struct AdamMath {
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

template <typename A> struct AdamaxMath {
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

template <typename A> struct RmsPropMath {
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
// The fused pass. Thread per VEC elements, grid-stride; elements past the last whole vector go one per
// thread. Slots that are nullptr are neither loaded nor stored. T is the weight's and the slots' type, G the
// gradient's: T = G, or (mixed precision) T = f32 master weights with G = bf16/f16, when the new weight is
// also stored, rounded, into `low` (the parameter the model computes with). Bytes per element: T weights
// and slots (2 + 2 S) x sizeof(T), plus the gradient read (and the low copy written).
template <typename T, typename G, int S, int VEC, typename F>
__global__ void __launch_bounds__(kThreads)
    fused_update(T* __restrict__ p, const G* __restrict__ g, G* __restrict__ low, Slots<T, S> slots, int64_t n,
                 acc_t<T> grad_scale, F f) {
  using A = acc_t<T>;
  constexpr int SA = S > 0 ? S : 1;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t vectors = n / VEC;
  for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += stride) {
    const int64_t i = v * VEC;
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
  for (int64_t i = vectors * VEC + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
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

// Launches fused_update for t with the given slot pointers (vectorized when every pointer is aligned).
// The weight is t.master when defined (then G is the parameter's dtype), else t.param (G = T).
template <typename T, typename G, int S, typename F>
void launch_update(const ParamUpdate& t, const Slots<T, S>& slots, const F& f) {
  const int64_t n = t.param.numel();
  if (n == 0) return;
  T* p = static_cast<T*>((t.master.defined() ? t.master : t.param).data_ptr());
  const G* g = static_cast<const G*>(t.grad.data_ptr());
  G* low = t.master.defined() ? static_cast<G*>(t.param.data_ptr()) : nullptr;
  bool aligned = aligned16(p) && aligned16(g) && (!low || aligned16(low));
  for (int s = 0; s < S; s++) aligned = aligned && (!slots.p[s] || aligned16(slots.p[s]));
  constexpr int V = vec16<T>();  // T is the wider type: V elements of G are <= 16 bytes
  const acc_t<T> scale = acc_t<T>(t.grad_scale);
  cudaStream_t stream = engine::cuda::stream();
  if (aligned)
    fused_update<T, G, S, V, F><<<grid_for((n + V - 1) / V, kThreads), kThreads, 0, stream>>>(p, g, low, slots, n,
                                                                                             scale, f);
  else
    fused_update<T, G, S, 1, F><<<grid_for(n, kThreads), kThreads, 0, stream>>>(p, g, low, slots, n, scale, f);
}

// T = G = the parameter's dtype, or T = f32 and G = the parameter's dtype under a master copy.
#define CUDA_OPTIM_SWITCH(t, ...)                                                                     \
  do {                                                                                                \
    if ((t).master.defined()) {                                                                       \
      ENGINE_CUDA_FLOAT_SWITCH((t).param.dtype(), G, { using T = float; __VA_ARGS__; });             \
    } else {                                                                                          \
      ENGINE_CUDA_FLOAT_SWITCH((t).param.dtype(), T, { using G = T; __VA_ARGS__; });                 \
    }                                                                                                 \
  } while (0)

template <typename T> T* slot_ptr(const ParamUpdate& t, size_t k) { return static_cast<T*>(t.slots[k].data_ptr()); }

// ---------------------------------------------------------------------------------------------------
// Squared norms

// Up to kNormTensors tensors per launch, passed by value (a __grid_constant__ parameter).
constexpr int kNormTensors = 48;
struct NormTable {
  const void* ptr[kNormTensors];
  int64_t numel[kNormTensors];
  int64_t first_chunk[kNormTensors + 1];  // chunk numbers of this launch, cumulative (relative)
  engine::DType dtype[kNormTensors];
  int count;
};

template <typename T> __device__ double chunk_squares(const void* p, int64_t begin, int64_t end) {
  const T* x = static_cast<const T*>(p);
  double s = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = double(to_acc<acc_t<T>>(x[i]));
    s += v * v;
  }
  return s;
}

// Stage 1: block = one chunk of one tensor (found by a scan of the table); its f64 sum of squares goes to
// partials[chunk]. Bytes: one read per element; bound: memory.
__global__ void __launch_bounds__(kThreads)
    squared_norm_chunks(const __grid_constant__ NormTable table, double* __restrict__ partials) {
  __shared__ double scratch[32];
  const int64_t chunk = blockIdx.x;
  int k = 0;
  while (k + 1 < table.count && table.first_chunk[k + 1] <= chunk) k++;
  const int64_t begin = (chunk - table.first_chunk[k]) * kNormChunk;
  const int64_t end = min(table.numel[k], begin + kNormChunk);
  double s = 0;
  switch (table.dtype[k]) {
    case engine::DType::f32: s = chunk_squares<float>(table.ptr[k], begin, end); break;
    case engine::DType::f64: s = chunk_squares<double>(table.ptr[k], begin, end); break;
    case engine::DType::bf16: s = chunk_squares<__nv_bfloat16>(table.ptr[k], begin, end); break;
    case engine::DType::f16: s = chunk_squares<__half>(table.ptr[k], begin, end); break;
    default: break;
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

void sgd_update(const ParamUpdate& t, const SgdStep& h) {
  CUDA_OPTIM_SWITCH(t, {
    using A = acc_t<T>;
    const bool momentum = h.momentum != 0;
    Slots<T, 1> slots{{momentum ? slot_ptr<T>(t, 0) : nullptr}};
    SgdMath<A> f{A(h.lr), A(h.weight_decay), A(h.momentum), A(1 - h.dampening),
                 h.weight_decay != 0, momentum, h.nesterov, h.first_step};
    launch_update<T, G>(t, slots, f);
  });
  ENGINE_CUDA_LAUNCH_CHECK("sgd");
}

void adam_update(const ParamUpdate& t, const AdamStep& h) {
  CUDA_OPTIM_SWITCH(t, {
    using A = acc_t<T>;
    const double step = double(h.step);
    Slots<T, 2> slots{{slot_ptr<T>(t, 0), slot_ptr<T>(t, 1)}};
    AdamMath<A> f{A(h.lr / (1 - std::pow(h.beta1, step))), A(std::sqrt(1 - std::pow(h.beta2, step))),
                  A(1 - h.beta1), A(h.beta2), A(1 - h.beta2), A(h.eps), A(h.weight_decay),
                  A(1 - h.lr * h.weight_decay), h.weight_decay != 0 && !h.decoupled_weight_decay,
                  h.weight_decay != 0 && h.decoupled_weight_decay};
    launch_update<T, G>(t, slots, f);
  });
  ENGINE_CUDA_LAUNCH_CHECK("adam");
}

void adamax_update(const ParamUpdate& t, const AdamaxStep& h) {
  CUDA_OPTIM_SWITCH(t, {
    using A = acc_t<T>;
    Slots<T, 2> slots{{slot_ptr<T>(t, 0), slot_ptr<T>(t, 1)}};
    AdamaxMath<A> f{A(h.lr / (1 - std::pow(h.beta1, double(h.step)))), A(1 - h.beta1), A(h.beta2), A(h.eps),
                    A(h.weight_decay), h.weight_decay != 0};
    launch_update<T, G>(t, slots, f);
  });
  ENGINE_CUDA_LAUNCH_CHECK("adamax");
}

void rmsprop_update(const ParamUpdate& t, const RmsPropStep& h) {
  CUDA_OPTIM_SWITCH(t, {
    using A = acc_t<T>;
    const bool momentum = h.momentum != 0;
    size_t k = 1;  // slots: {square_avg, [momentum_buffer], [grad_avg]}
    T* buf = momentum ? slot_ptr<T>(t, k++) : nullptr;
    T* grad_avg = h.centered ? slot_ptr<T>(t, k++) : nullptr;
    Slots<T, 3> slots{{slot_ptr<T>(t, 0), buf, grad_avg}};
    RmsPropMath<A> f{A(h.lr), A(h.alpha), A(1 - h.alpha), A(h.eps), A(h.weight_decay), A(h.momentum),
                     h.weight_decay != 0, momentum, h.centered, h.tf_style};
    launch_update<T, G>(t, slots, f);
  });
  ENGINE_CUDA_LAUNCH_CHECK("rmsprop");
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
  for (size_t first = 0; first < xs.size(); first += kNormTensors) {
    NormTable table{};
    table.count = int(std::min<size_t>(kNormTensors, xs.size() - first));
    for (int k = 0; k < table.count; k++) {
      const Tensor& x = xs[first + size_t(k)];
      table.ptr[k] = x.data_ptr();
      table.numel[k] = x.numel();
      table.dtype[k] = x.dtype();
      table.first_chunk[k + 1] = table.first_chunk[k] + (x.numel() + kNormChunk - 1) / kNormChunk;
    }
    const int64_t launch_chunks = table.first_chunk[table.count];
    if (launch_chunks > 0) {
      squared_norm_chunks<<<unsigned(launch_chunks), kThreads, 0, stream>>>(table, pp);
      ENGINE_CUDA_LAUNCH_CHECK("squared_norms (chunks)");
    }
    squared_norm_totals<<<unsigned(table.count), kThreads, 0, stream>>>(table, pp, po + first);
    ENGINE_CUDA_LAUNCH_CHECK("squared_norms");
    pp += launch_chunks;
  }
}

}  // namespace ops::cuda
