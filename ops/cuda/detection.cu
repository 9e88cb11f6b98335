// cuda/detection.cu: topk, box_iou and nms on the GPU.
//
//   topk_kernel      a block per row. Radix select of the k-th largest key (cpu/detection.h's topk_key: value, then
//                    index, so keys are distinct) in 8 passes of 8 bits, each a shared histogram (integer atomics:
//                    the counts, hence the digits, do not depend on the order); then the k keys >= it are gathered
//                    (in any order) and bitonic-sorted in shared memory: the output is the unique sorted answer.
//                    Bound: 9 reads of the row (the passes) for one block per row; fine for the RPN's rows (tens
//                    of thousands of anchors, a few rows), not a general large-batch top-k.
//   box_iou_kernel   a thread per IoU (cpu/detection.h's box_iou_of).
//   nms_mask_kernel  a block of 64 threads per (image, 64-row chunk, 64-column chunk): thread i sets bit j of its
//                    row's word when j > i and IoU(i, j) > threshold (the column chunk's boxes in shared memory).
//   box_code_kernel  a thread per box (cpu/detection.h's encode_box / decode_box).
//   match_gmax_kernel, match_kernel  a block per (image, truth) finds the truth's best IoU (a max: exact in any
//                    order), then a thread per anchor applies match_anchor.
//   polygon_mask_kernel  a thread per crop pixel tests its cell's centre against every edge of its truth's parts
//                    (cpu/detection.h's polygon_mask_pixel). Bound: the edge loop (P V per pixel, from L1).
//   nms_scan_kernel  a block per image walks the boxes in order (the greedy decision is sequential): a valid box
//                    not yet removed is kept and its row of the mask is ORed into the removed words by all threads.
#include "ops/cpu/detection.h"
#include "ops/cuda/detection.h"
#include "ops/cuda/kernel_util.cuh"

namespace ops::cuda {

using engine::Tensor;

namespace {

constexpr int kTopkThreads = 1024;

template <typename T>
__global__ void topk_kernel(const T* x, int64_t K, int64_t k, int64_t P, T* values, int64_t* indices) {
  __shared__ unsigned hist[256];
  __shared__ uint64_t prefix_s, mask_s;
  __shared__ int64_t remaining_s;
  __shared__ unsigned count_s;
  extern __shared__ uint64_t cand[];  // [P], P the power of two >= k
  const T* row = x + int64_t(blockIdx.x) * K;
  if (threadIdx.x == 0) prefix_s = 0, mask_s = 0, remaining_s = k, count_s = 0;
  __syncthreads();
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += blockDim.x) hist[d] = 0;
    __syncthreads();
    const uint64_t prefix = prefix_s, mask = mask_s;
    for (int64_t i = threadIdx.x; i < K; i += blockDim.x) {
      const uint64_t key = cpu::topk_key(float(to_acc<float>(row[i])), i);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // the digit of the k-th largest among the keys that share the prefix
      int64_t above = 0, remaining = remaining_s;
      int d = 255;
      for (; d > 0 && above + int64_t(hist[d]) < remaining; d--) above += hist[d];
      remaining_s = remaining - above;
      prefix_s = prefix | (uint64_t(d) << shift);
      mask_s = mask | (uint64_t(255) << shift);
    }
    __syncthreads();
  }
  const uint64_t threshold = prefix_s;  // the k-th largest key itself: exactly k keys are >= it
  for (int64_t i = threadIdx.x; i < K; i += blockDim.x) {
    const uint64_t key = cpu::topk_key(float(to_acc<float>(row[i])), i);
    if (key >= threshold) cand[atomicAdd(&count_s, 1u)] = key;
  }
  for (int64_t i = k + threadIdx.x; i < P; i += blockDim.x) cand[i] = 0;  // below every real key
  __syncthreads();
  for (int64_t size = 2; size <= P; size <<= 1)  // bitonic sort, decreasing
    for (int64_t stride = size / 2; stride > 0; stride >>= 1) {
      for (int64_t t = threadIdx.x; t < P / 2; t += blockDim.x) {
        const int64_t i = 2 * t - (t & (stride - 1)), j = i + stride;
        const bool decreasing = (i & size) == 0;
        const uint64_t a = cand[i], b = cand[j];
        if ((a < b) == decreasing) cand[i] = b, cand[j] = a;
      }
      __syncthreads();
    }
  for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
    const int64_t i = cpu::topk_key_index(cand[j]);
    indices[int64_t(blockIdx.x) * k + j] = i;
    values[int64_t(blockIdx.x) * k + j] = row[i];
  }
}

__global__ void box_iou_kernel(const float* a, const float* b, int64_t N, int64_t A, int64_t B, float* iou) {
  const int64_t total = N * A * B;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % B, na = e / B, n = na / A;
    iou[e] = cpu::box_iou_of(a + na * 4, b + (n * B + j) * 4);
  }
}

__global__ void nms_mask_kernel(const float* boxes, int64_t K, int64_t words, float threshold, uint64_t* mask) {
  __shared__ float cols[64 * 4];
  const int64_t n = blockIdx.z, row0 = int64_t(blockIdx.y) * 64, col0 = int64_t(blockIdx.x) * 64;
  const float* box = boxes + n * K * 4;
  const int64_t c = col0 + threadIdx.x;
  if (c < K)
    for (int q = 0; q < 4; q++) cols[threadIdx.x * 4 + q] = box[c * 4 + q];
  __syncthreads();
  const int64_t i = row0 + threadIdx.x;
  if (i >= K) return;
  uint64_t bits = 0;
  for (int64_t t = 0; t < 64 && col0 + t < K; t++)
    if (col0 + t > i && cpu::box_iou_of(box + i * 4, cols + t * 4) > threshold) bits |= uint64_t(1) << t;
  mask[(n * K + i) * words + blockIdx.x] = bits;
}

__global__ void nms_scan_kernel(const uint64_t* mask, const bool* valid, int64_t K, int64_t words, int64_t M,
                                int64_t* keep) {
  extern __shared__ uint64_t removed[];  // [words]
  const int64_t n = blockIdx.x;
  for (int64_t w = threadIdx.x; w < words; w += blockDim.x) removed[w] = 0;
  __syncthreads();
  int64_t kept = 0;  // the same in every thread: every decision below is uniform across the block
  for (int64_t i = 0; i < K && kept < M; i++) {
    const bool take = (!valid || valid[n * K + i]) && !((removed[i >> 6] >> (i & 63)) & 1u);
    if (!take) continue;
    if (threadIdx.x == 0) keep[n * M + kept] = i;
    kept++;
    const uint64_t* row = mask + (n * K + i) * words;
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) removed[w] |= row[w];
    __syncthreads();
  }
  for (int64_t j = kept + threadIdx.x; j < M; j += blockDim.x) keep[n * M + j] = -1;
}

__global__ void box_code_kernel(bool decode, const float* in, const float* ref, cpu::CoderWeights w, const float* hw,
                                int64_t N, int64_t K, float* out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N * K; i += int64_t(gridDim.x) * blockDim.x) {
    if (!decode) {
      cpu::encode_box(ref + i * 4, in + i * 4, w, out + i * 4);
    } else {
      const int64_t n = i / K;
      cpu::decode_box(ref + i * 4, in + i * 4, w, hw != nullptr, hw ? hw[n * 2] : 0.f, hw ? hw[n * 2 + 1] : 0.f,
                      out + i * 4);
    }
  }
}

__global__ void match_gmax_kernel(const float* iou, int64_t A, float* gmax) {
  __shared__ float part[256];
  const float* row = iou + int64_t(blockIdx.x) * A;
  float v = -1.f;
  for (int64_t a = threadIdx.x; a < A; a += blockDim.x) v = fmaxf(v, row[a]);
  part[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) part[threadIdx.x] = fmaxf(part[threadIdx.x], part[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) gmax[blockIdx.x] = part[0];
}

__global__ void match_kernel(const float* iou, const bool* valid, const float* gmax, int64_t N, int64_t G, int64_t A,
                             float high, float low, bool allow_low_quality, int64_t* matches) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N * A; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / A, a = i % A;
    matches[i] = cpu::match_anchor(iou + n * G * A, G, A, a, gmax + n * G, valid ? valid + n * G : nullptr, high, low,
                                   allow_low_quality);
  }
}

__global__ void polygon_mask_kernel(const float* poly, const int64_t* counts, const float* rois, const int64_t* truth,
                                    int64_t N, int64_t R, int64_t G, int64_t P, int64_t V, int64_t M, float* masks) {
  const int64_t total = N * R * M * M;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % M, i = (e / M) % M, nr = e / (M * M), n = nr / R;
    const float* b = rois + nr * 4;
    const int64_t g = truth[nr];
    const float bw = cpu::sub_rn(b[2], b[0]), bh = cpu::sub_rn(b[3], b[1]);
    masks[e] = g < 0 || g >= G ? 0.f
                               : cpu::polygon_mask_pixel(poly + (n * G + g) * P * V * 2, counts + (n * G + g) * P, P, V,
                                                         b[0], b[1], bw > 1.f ? bw : 1.f, bh > 1.f ? bh : 1.f, M, i, j);
  }
}

}  // namespace

void box_code(bool decode, const Tensor& in, const Tensor& reference, const cpu::CoderWeights& w,
              const Tensor& image_hw, const Tensor& out) {
  const int64_t N = in.size(0), K = in.size(1);
  if (N * K == 0) return;
  box_code_kernel<<<grid_for(N * K, 256), 256, 0, engine::cuda::stream()>>>(
      decode, static_cast<const float*>(in.data_ptr()), static_cast<const float*>(reference.data_ptr()), w,
      image_hw.defined() ? static_cast<const float*>(image_hw.data_ptr()) : nullptr, N, K,
      static_cast<float*>(out.data_ptr()));
  ENGINE_CUDA_LAUNCH_CHECK(decode ? "box_decode" : "box_encode");
}

void polygon_masks(const Tensor& polygons, const Tensor& counts, const Tensor& rois, const Tensor& truth,
                   const Tensor& masks) {
  if (masks.numel() == 0) return;
  polygon_mask_kernel<<<grid_for(masks.numel(), 256), 256, 0, engine::cuda::stream()>>>(
      static_cast<const float*>(polygons.data_ptr()), static_cast<const int64_t*>(counts.data_ptr()),
      static_cast<const float*>(rois.data_ptr()), static_cast<const int64_t*>(truth.data_ptr()), rois.size(0),
      rois.size(1), polygons.size(1), polygons.size(2), polygons.size(3), masks.size(2),
      static_cast<float*>(masks.data_ptr()));
  ENGINE_CUDA_LAUNCH_CHECK("polygon_masks");
}

void match_boxes(const Tensor& iou, const Tensor& valid, float high, float low, bool allow_low_quality,
                 const Tensor& gmax, const Tensor& matches) {
  const int64_t N = iou.size(0), G = iou.size(1), A = iou.size(2);
  if (N * A == 0) return;
  cudaStream_t stream = engine::cuda::stream();
  const float* q = static_cast<const float*>(iou.data_ptr());
  float* best = static_cast<float*>(gmax.data_ptr());
  if (N * G > 0) match_gmax_kernel<<<unsigned(N * G), 256, 0, stream>>>(q, A, best);
  match_kernel<<<grid_for(N * A, 256), 256, 0, stream>>>(
      q, valid.defined() ? static_cast<const bool*>(valid.data_ptr()) : nullptr, best, N, G, A, high, low,
      allow_low_quality, static_cast<int64_t*>(matches.data_ptr()));
  ENGINE_CUDA_LAUNCH_CHECK("match_boxes");
}

void topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices) {
  const int64_t N = x.size(0), K = x.size(1);
  if (N == 0) return;
  int64_t P = 1;
  while (P < k) P <<= 1;
  cudaStream_t stream = engine::cuda::stream();
  ENGINE_CUDA_FLOAT_SWITCH(x.dtype(), T, {
    topk_kernel<T><<<unsigned(N), kTopkThreads, size_t(P) * sizeof(uint64_t), stream>>>(
        static_cast<const T*>(x.data_ptr()), K, k, P, static_cast<T*>(values.data_ptr()),
        static_cast<int64_t*>(indices.data_ptr()));
  });
  ENGINE_CUDA_LAUNCH_CHECK("topk");
}

void box_iou(const Tensor& a, const Tensor& b, const Tensor& iou) {
  if (iou.numel() == 0) return;
  box_iou_kernel<<<grid_for(iou.numel(), 256), 256, 0, engine::cuda::stream()>>>(
      static_cast<const float*>(a.data_ptr()), static_cast<const float*>(b.data_ptr()), a.size(0), a.size(1), b.size(1),
      static_cast<float*>(iou.data_ptr()));
  ENGINE_CUDA_LAUNCH_CHECK("box_iou");
}

void nms(const Tensor& boxes, const Tensor& valid, float iou_threshold, const Tensor& mask, const Tensor& keep) {
  const int64_t N = boxes.size(0), K = boxes.size(1), M = keep.size(1), words = (K + 63) / 64;
  if (N == 0) return;
  cudaStream_t stream = engine::cuda::stream();
  uint64_t* bits = static_cast<uint64_t*>(mask.data_ptr());
  if (K > 0) {
    nms_mask_kernel<<<dim3(unsigned(words), unsigned(words), unsigned(N)), 64, 0, stream>>>(
        static_cast<const float*>(boxes.data_ptr()), K, words, iou_threshold, bits);
    ENGINE_CUDA_LAUNCH_CHECK("nms");
  }
  nms_scan_kernel<<<unsigned(N), 256, size_t(words) * sizeof(uint64_t), stream>>>(
      bits, valid.defined() ? static_cast<const bool*>(valid.data_ptr()) : nullptr, K, words, M,
      static_cast<int64_t*>(keep.data_ptr()));
  ENGINE_CUDA_LAUNCH_CHECK("nms");
}

}  // namespace ops::cuda
