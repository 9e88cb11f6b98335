// cuda/shape.cu: concat, gather / index_select / embedding, masked_fill, where.
//
// These ops move elements without arithmetic (except scatter-add's sums), so the copying kernels work on
// raw words of the element's size (1, 2, 4 or 8 bytes; 16 where a whole row can move as vectors) and
// serve every dtype. Element positions come from an Indexer (any strides, broadcasting by stride 0).
//
// Scatter-add, the gradient of gather / index_select / embedding, is in shape_scatter.cu.
#include <cstring>
#include <string>
#include <vector>

#include "ops/cpu/cpu_util.h"  // broadcast_strides, ENGINE_ALL_SWITCH (masked_fill's value on the host)
#include "ops/cpu/shape.h"     // checked_index: the CPU's error message
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/shape.h"
#include "ops/cuda/shape_util.cuh"

namespace ops::cuda {

using engine::Shape;
using engine::Tensor;

// ---------------------------------------------------------------------------------------------------
// The out-of-range index records (declared in kernel_util.cuh): a ring of records in mapped pinned host memory,
// one per indexing op since the last synchronization, read after the next one.

namespace {
constexpr int kIndexErrorSlots = 1024;
IndexError* g_index_error_host = nullptr;
IndexError* g_index_error_device = nullptr;
struct PendingCheck {
  std::string op;
  int64_t size;
};
std::vector<PendingCheck> g_pending;  // slot i: the op that used record i

// Runs after the stream was synchronized (engine::cuda::on_synchronized): every pending record is read, the
// list cleared, then the first op whose record was hit throws the CPU's message.
void check_index_errors() {
  std::vector<PendingCheck> pending;
  pending.swap(g_pending);
  for (size_t i = 0; i < pending.size(); i++) {
    volatile IndexError* h = g_index_error_host + i;
    if (h->hit) cpu::checked_index(pending[i].op.c_str(), h->value, pending[i].size);
  }
}
}  // namespace

IndexError* index_error_begin() {
  if (!g_index_error_host) {
    ENGINE_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&g_index_error_host),
                                    sizeof(IndexError) * kIndexErrorSlots, cudaHostAllocMapped));
    ENGINE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&g_index_error_device), g_index_error_host, 0));
    engine::cuda::on_synchronized(check_index_errors);
  }
  if (g_pending.size() == size_t(kIndexErrorSlots)) engine::cuda::synchronize_and_check();  // the ring is full
  const size_t slot = g_pending.size();
  volatile IndexError* h = g_index_error_host + slot;
  h->hit = 0;
  h->value = 0;
  return g_index_error_device + slot;
}

void index_error_end(const char* op, int64_t size) { g_pending.push_back({op, size}); }

namespace {

// ENGINE_WORD_SWITCH(bytes, W, { body using W }): W is an unsigned word of the element's size.
#define ENGINE_WORD_SWITCH(bytes, W, ...)                                                               \
  switch (bytes) {                                                                                    \
    case 1: { using W = uint8_t; __VA_ARGS__; } break;                                                \
    case 2: { using W = uint16_t; __VA_ARGS__; } break;                                               \
    case 4: { using W = uint32_t; __VA_ARGS__; } break;                                               \
    case 8: { using W = uint64_t; __VA_ARGS__; } break;                                               \
    default: throw ::engine::Error(::engine::str("cuda shape kernel: element size ", bytes, " is not supported")); \
  }

constexpr int kThreads = 256;

// Calls f(int32_t{}) when 32-bit indexing is safe for n elements over these tensors, else f(int64_t{}).
template <typename F> void with_index_type(int64_t n, std::initializer_list<const Tensor*> ts, F&& f) {
  if (fits_int32(n, ts)) f(int32_t{});
  else f(int64_t{});
}

// ---------------------------------------------------------------------------------------------------
// Copies

// dst[j] = src[i] through an Indexer {src, dst}. Bytes: one read + one write per element; bound: memory.
template <typename W, typename I>
__global__ void strided_copy(const W* __restrict__ src, W* __restrict__ dst, const __grid_constant__ Indexer<2, I> ix,
                             I n) {
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    I off[2];
    ix.offsets(i, off);
    dst[off[1]] = src[off[0]];
  }
}

// rows x width bytes from src (rows `src_pitch` bytes apart) to dst (`dst_pitch` apart), one word W (up to 16
// bytes, the widest that divides the width, both pitches and both addresses) per thread; I = uint32_t when
// the word count fits. concat's copy of an input into its window of the output (NHWC along channels: rows
// of a few hundred bytes, which cudaMemcpy2DAsync moved at ~0.9 TB/s). Bytes: one read + one write.
template <typename W, typename I>
__global__ void __launch_bounds__(kThreads)
    copy_rows(const char* __restrict__ src, int64_t src_pitch, char* __restrict__ dst, int64_t dst_pitch, I words,
              I words_per_row) {
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < words; i += I(gridDim.x) * blockDim.x) {
    const I row = i / words_per_row, col = i - row * words_per_row;
    *reinterpret_cast<W*>(dst + int64_t(row) * dst_pitch + int64_t(col) * int64_t(sizeof(W))) =
        *reinterpret_cast<const W*>(src + int64_t(row) * src_pitch + int64_t(col) * int64_t(sizeof(W)));
  }
}

void launch_copy_rows(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t width, int64_t rows,
                      cudaStream_t stream) {
  int64_t word = 16;
  const auto fits = [&](int64_t v) { return v % word == 0; };
  while (word > 1 && !(fits(width) && fits(src_pitch) && fits(dst_pitch) && fits(int64_t(uintptr_t(src))) &&
                       fits(int64_t(uintptr_t(dst)))))
    word /= 2;
  const int64_t per_row = width / word, words = per_row * rows;
  auto launch = [&](auto w, auto i) {
    using W = decltype(w);
    using I = decltype(i);
    copy_rows<W, I><<<grid_for(words, kThreads), kThreads, 0, stream>>>(
        static_cast<const char*>(src), src_pitch, static_cast<char*>(dst), dst_pitch, I(words), I(per_row));
  };
  auto with_word = [&](auto i) {
    switch (word) {
      case 16:
        launch(uint4(), i);
        break;
      case 8:
        launch(uint2(), i);
        break;
      case 4:
        launch(uint32_t(), i);
        break;
      case 2:
        launch(uint16_t(), i);
        break;
      default:
        launch(uint8_t(), i);
        break;
    }
  };
  if (words <= int64_t(UINT32_MAX))
    with_word(uint32_t());
  else
    with_word(int64_t());
}

// ---------------------------------------------------------------------------------------------------
// Gather

// Rows form: x contiguous [O, n, U] (U words per row), index 1-D along dim; out [O, J, U].
// Thread per word t = (o, j, u). Bytes: one read + one write per word (16-byte words when rows allow),
// the index from cache; bound: memory.
template <typename W, typename I, typename Idx>
__global__ void gather_rows(const W* __restrict__ x, const Idx* __restrict__ index, int64_t is, W* __restrict__ out,
                            I total, I J, I U, int64_t n, IndexError* err) {
  for (I t = I(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += I(gridDim.x) * blockDim.x) {
    const I u = t % U, r = t / U, j = r % J, o = r / J;
    const int64_t v = int64_t(index[j * is]);
    if (v < 0 || v >= n) {
      report_bad_index(err, v);
      continue;
    }
    out[t] = x[(int64_t(o) * n + v) * U + u];
  }
}

// Any layout: out[i] = x[x_off(i) + index[index_off(i)] * step] with x's stride along dim zeroed in the
// Indexer. Bytes: one read of x and of the index + one write per element; bound: memory transactions.
template <typename W, typename I, typename Idx>
__global__ void gather_elements(const W* __restrict__ x, const Idx* __restrict__ index, W* __restrict__ out,
                                const __grid_constant__ Indexer<2, I> ix, I numel, int64_t n, int64_t step,
                                IndexError* err) {
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += I(gridDim.x) * blockDim.x) {
    I off[2];
    ix.offsets(i, off);
    const int64_t v = int64_t(index[off[1]]);
    if (v < 0 || v >= n) {
      report_bad_index(err, v);
      continue;
    }
    out[i] = x[int64_t(off[0]) + v * step];
  }
}

// ---------------------------------------------------------------------------------------------------
// masked_fill and where: one thread per output element. Bytes: the inputs' reads (broadcast ones from
// cache) + one write per element; bound: memory.

template <typename W, typename I>
__global__ void masked_fill_elements(const W* __restrict__ x, const uint8_t* __restrict__ mask, W value,
                                     W* __restrict__ out, const __grid_constant__ Indexer<2, I> ix, I n) {
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    I off[2];
    ix.offsets(i, off);
    out[i] = mask[off[1]] ? value : x[off[0]];
  }
}

// masked_fill by 16-byte vectors of x and out along the last dimension (x's rows unit-stride, every row a whole number
// of vectors), for the attention scores' [B, H, Lq, Lk] under a [B, 1, 1, Lk] key mask: the Indexer's divisions once
// per vector, not per element (the element kernel moved 1.6 TB/s there on an H100; bound: memory). ix indexes
// vectors: offsets {x's vector, the mask's element of the vector's first word}; mask_step: the mask's last stride.
template <typename W, typename I>
__global__ void masked_fill_vectors(const uint4* __restrict__ x, const uint8_t* __restrict__ mask, I mask_step,
                                    W value, uint4* __restrict__ out, const __grid_constant__ Indexer<2, I> ix, I n) {
  constexpr int kWords = int(sizeof(uint4) / sizeof(W));
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    I off[2];
    ix.offsets(i, off);
    uint4 v = x[off[0]];
    W* words = reinterpret_cast<W*>(&v);
#pragma unroll
    for (int k = 0; k < kWords; k++)
      if (mask[off[1] + I(k) * mask_step]) words[k] = value;
    out[i] = v;
  }
}

template <typename W, typename I>
__global__ void where_elements(const uint8_t* __restrict__ cond, const W* __restrict__ a, const W* __restrict__ b,
                               W* __restrict__ out, const __grid_constant__ Indexer<3, I> ix, I n) {
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    I off[3];
    ix.offsets(i, off);
    out[i] = cond[off[0]] ? a[off[1]] : b[off[2]];
  }
}


}  // namespace

// ---------------------------------------------------------------------------------------------------

void concat(const std::vector<Tensor>& xs, int64_t dim, const Tensor& out) {
  const size_t es = engine::dtype_size(out.dtype());
  const int64_t outer = prod(out.shape(), 0, size_t(dim)),
                inner = prod(out.shape(), size_t(dim) + 1, out.shape().size());
  cudaStream_t stream = engine::cuda::stream();
  int64_t start = 0;
  for (const Tensor& x : xs) {
    const int64_t n = x.shape()[size_t(dim)];
    Tensor window = Tensor::view_of(out, x.shape(), out.strides(), out.offset() + start * out.strides()[size_t(dim)]);
    start += n;
    if (x.numel() == 0) continue;
    if (x.is_contiguous() && outer == 1) {
      ENGINE_CUDA_CHECK(cudaMemcpyAsync(window.data_ptr(), x.data_ptr(), x.nbytes(), cudaMemcpyDeviceToDevice, stream));
      continue;
    }
    if (x.is_contiguous()) {
      // outer rows of n * inner contiguous elements, landing every out.shape[dim] * inner elements.
      const int64_t width = n * inner * int64_t(es);
      launch_copy_rows(x.data_ptr(), width, window.data_ptr(), out.shape()[size_t(dim)] * inner * int64_t(es), width,
                       outer, stream);
      ENGINE_CUDA_LAUNCH_CHECK("concat");
      continue;
    }
    with_index_type(x.numel(), {&x, &window}, [&](auto tag) {
      using I = decltype(tag);
      const auto ix = make_indexer<2, I>("concat", x.shape(), {x.strides(), window.strides()});
      ENGINE_WORD_SWITCH(es, W, {
        strided_copy<W, I><<<grid_for(x.numel(), kThreads), kThreads, 0, stream>>>(
            static_cast<const W*>(x.data_ptr()), static_cast<W*>(window.data_ptr()), ix, I(x.numel()));
      });
    });
    ENGINE_CUDA_LAUNCH_CHECK("concat");
  }
}

void gather(const char* op, const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) {
  const int64_t numel = out.numel(), n = x.shape()[size_t(dim)];
  if (numel == 0) return;
  const size_t es = engine::dtype_size(x.dtype());
  cudaStream_t stream = engine::cuda::stream();
  IndexError* err = index_error_begin();
  ENGINE_CUDA_INDEX_SWITCH(index.dtype(), Idx, {
    const Idx* pi = static_cast<const Idx*>(index.data_ptr());
    if (x.is_contiguous() && index_is_rows(index, dim) && same_except(x.shape(), out.shape(), dim)) {
      // Rows form: whole rows of `inner` elements move, as 16-byte words when they allow it.
      const int64_t inner = prod(x.shape(), size_t(dim) + 1, x.shape().size()), J = out.shape()[size_t(dim)];
      const int64_t row_bytes = inner * int64_t(es);
      const bool wide = row_bytes % 16 == 0 && aligned16(x.data_ptr()) && aligned16(out.data_ptr());
      const int64_t word = wide ? 16 : int64_t(es), U = row_bytes / word, total = numel * int64_t(es) / word;
      const int64_t is = index.strides()[size_t(dim)];
      auto launch = [&](auto word_tag, auto index_tag) {
        using W = decltype(word_tag);
        using I = decltype(index_tag);
        gather_rows<W, I, Idx><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
            static_cast<const W*>(x.data_ptr()), pi, is, static_cast<W*>(out.data_ptr()), I(total), I(J), I(U), n, err);
      };
      const bool small = x.numel() * int64_t(es) / word < (int64_t(1) << 31) && total < (int64_t(1) << 31);
      if (wide) {
        if (small) launch(uint4{}, int32_t{});
        else launch(uint4{}, int64_t{});
      } else {
        ENGINE_WORD_SWITCH(es, W, {
          if (small) launch(W{}, int32_t{});
          else launch(W{}, int64_t{});
        });
      }
    } else {
      Shape x_strides = x.strides();
      const int64_t step = x_strides[size_t(dim)];
      x_strides[size_t(dim)] = 0;
      with_index_type(numel, {&x, &index, &out}, [&](auto tag) {
        using I = decltype(tag);
        const auto ix = make_indexer<2, I>(op, out.shape(), {x_strides, index.strides()});
        ENGINE_WORD_SWITCH(es, W, {
          gather_elements<W, I, Idx><<<grid_for(numel, kThreads), kThreads, 0, stream>>>(
              static_cast<const W*>(x.data_ptr()), pi, static_cast<W*>(out.data_ptr()), ix, I(numel), n, step, err);
        });
      });
    }
  });
  ENGINE_CUDA_LAUNCH_CHECK("gather");
  index_error_end(op, n);
}

void masked_fill(const Tensor& x, const Tensor& mask, double value, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const size_t es = engine::dtype_size(x.dtype());
  uint64_t bits = 0;  // value in x's dtype, converted on the host exactly as the CPU does
  ENGINE_ALL_SWITCH(x.dtype(), T, {
    const T v = static_cast<T>(static_cast<engine::acc_t<T>>(value));
    std::memcpy(&bits, &v, sizeof(T));
  });
  const Shape mask_strides = cpu::broadcast_strides(mask, out.shape());
  cudaStream_t stream = engine::cuda::stream();
  // Vectors along the last dimension when x's rows are whole, aligned vectors (out is contiguous).
  const int64_t words = 16 / int64_t(es), last = x.shape().empty() ? 1 : x.shape().back();
  bool vectors = out.is_contiguous() && !x.shape().empty() && x.strides().back() == 1 && last % words == 0 &&
                 aligned16(x.data_ptr()) && aligned16(out.data_ptr());
  for (size_t d = 0; vectors && d + 1 < x.shape().size(); d++) vectors = x.strides()[d] % words == 0;
  if (vectors) {
    Shape shape = out.shape(), xs = x.strides(), ms = mask_strides;
    shape.back() /= words;
    for (size_t d = 0; d + 1 < xs.size(); d++) xs[d] /= words;
    ms.back() *= words;
    const int64_t vecs = n / words;
    with_index_type(n, {&x, &mask, &out}, [&](auto tag) {
      using I = decltype(tag);
      const auto ix = make_indexer<2, I>("masked_fill", shape, {xs, ms});
      ENGINE_WORD_SWITCH(es, W, {
        W v;
        std::memcpy(&v, &bits, sizeof(W));
        masked_fill_vectors<W, I><<<grid_for(vecs, kThreads), kThreads, 0, stream>>>(
            static_cast<const uint4*>(x.data_ptr()), static_cast<const uint8_t*>(mask.data_ptr()),
            I(mask_strides.back()), v, static_cast<uint4*>(out.data_ptr()), ix, I(vecs));
      });
    });
    ENGINE_CUDA_LAUNCH_CHECK("masked_fill");
    return;
  }
  with_index_type(n, {&x, &mask, &out}, [&](auto tag) {
    using I = decltype(tag);
    const auto ix = make_indexer<2, I>("masked_fill", out.shape(), {x.strides(), mask_strides});
    ENGINE_WORD_SWITCH(es, W, {
      W v;
      std::memcpy(&v, &bits, sizeof(W));
      masked_fill_elements<W, I><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
          static_cast<const W*>(x.data_ptr()), static_cast<const uint8_t*>(mask.data_ptr()), v,
          static_cast<W*>(out.data_ptr()), ix, I(n));
    });
  });
  ENGINE_CUDA_LAUNCH_CHECK("masked_fill");
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const size_t es = engine::dtype_size(a.dtype());
  const Shape& shape = out.shape();
  cudaStream_t stream = engine::cuda::stream();
  with_index_type(n, {&cond, &a, &b, &out}, [&](auto tag) {
    using I = decltype(tag);
    const auto ix = make_indexer<3, I>(
        "where", shape,
        {cpu::broadcast_strides(cond, shape), cpu::broadcast_strides(a, shape), cpu::broadcast_strides(b, shape)});
    ENGINE_WORD_SWITCH(es, W, {
      where_elements<W, I><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
          static_cast<const uint8_t*>(cond.data_ptr()), static_cast<const W*>(a.data_ptr()),
          static_cast<const W*>(b.data_ptr()), static_cast<W*>(out.data_ptr()), ix, I(n));
    });
  });
  ENGINE_CUDA_LAUNCH_CHECK("where");
}

}  // namespace ops::cuda
