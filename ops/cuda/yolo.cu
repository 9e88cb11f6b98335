// cuda/yolo.cu: YOLOv3 target assignment on the GPU, in the cpu's two passes, one kernel each:
//   yolo_objectness  a thread per prediction (n, j, i, a): zeroes its target and weight rows, then writes its
//                    objectness weight (0 when its decoded box overlaps a truth by more than ignore_thresh);
//                    it also reports a label >= C
//   yolo_positives   a thread per image: its truths in slot order (a later truth on the same cell and anchor
//                    overwrites the box targets, as on the cpu), each written to its assigned row
// The second runs after the first on the stream. Work is tiny next to the network (N H W A M IoUs).
#include "ops/cpu/yolo.h"
#include "ops/cuda/convert.cuh"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/yolo.h"

namespace ops::cuda {

using engine::Tensor;
using cpu::YoloGeometry;

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void yolo_objectness(const T* __restrict__ pred, const float* __restrict__ boxes,
                                const int64_t* __restrict__ labels, int64_t N, YoloGeometry g, T* __restrict__ target,
                                acc_t<T>* __restrict__ weight, IndexError* err) {
  using A = acc_t<T>;
  const int64_t predictions = N * g.H * g.W * g.A, C = g.D - 5;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < predictions; p += step) {
    const int64_t a = p % g.A, i = (p / g.A) % g.W, j = (p / (g.A * g.W)) % g.H, n = p / (g.A * g.W * g.H);
    const float* boxes_n = boxes + n * g.M * 4;
    const int64_t* labels_n = labels + n * g.M;
    if (a == 0 && i == 0 && j == 0)
      for (int64_t m = 0; m < g.M; m++)
        if (labels_n[m] >= C) report_bad_index(err, labels_n[m]);
    const T* x = pred + p * g.D;
    for (int64_t d = 0; d < g.D; d++) {
      target[p * g.D + d] = st<T>(A(0));
      weight[p * g.D + d] = A(0);
    }
    const bool ignored = cpu::yolo_ignored(g, double(ld(x[0])), double(ld(x[1])), double(ld(x[2])),
                                           double(ld(x[3])), j, i, a, boxes_n, labels_n);
    weight[p * g.D + 4] = ignored ? A(0) : A(1);
  }
}

template <typename T>
__global__ void yolo_positives(const float* __restrict__ boxes, const int64_t* __restrict__ labels, int64_t N,
                               YoloGeometry g, T* __restrict__ target, acc_t<T>* __restrict__ weight) {
  using A = acc_t<T>;
  const int64_t C = g.D - 5;
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  for (int64_t m = 0; m < g.M; m++) {
    const int64_t label = labels[n * g.M + m];
    if (label < 0 || label >= C) continue;  // padding; a bad label is reported by yolo_objectness
    const cpu::YoloAssignment r = cpu::yolo_assign(g, boxes + (n * g.M + m) * 4);
    if (r.a < 0) continue;
    const int64_t row = (((n * g.H + r.j) * g.W + r.i) * g.A + r.a) * g.D;
    for (int k = 0; k < 4; k++) {
      target[row + k] = st<T>(A(r.t[k]));
      weight[row + k] = A(r.scale);
    }
    target[row + 4] = st<T>(A(1));
    weight[row + 4] = A(1);
    for (int64_t c = 0; c < C; c++) weight[row + 5 + c] = A(1);
    target[row + 5 + label] = st<T>(A(1));
  }
}

}  // namespace

void yolo_targets(const Tensor& pred, const Tensor& boxes, const Tensor& labels, const YoloTargetParams& p,
                  const Tensor& target, const Tensor& weight) {
  const YoloGeometry g = cpu::yolo_geometry(pred, boxes, p);
  const int64_t N = pred.shape()[0], predictions = pred.numel() / g.D;
  if (predictions == 0) return;
  cudaStream_t stream = engine::cuda::stream();
  IndexError* err = index_error_begin();
  ENGINE_CUDA_FLOAT_SWITCH(pred.dtype(), T, {
    using A = acc_t<T>;
    const T* px = static_cast<const T*>(pred.data_ptr());
    const float* pb = static_cast<const float*>(boxes.data_ptr());
    const int64_t* pl = static_cast<const int64_t*>(labels.data_ptr());
    T* pt = static_cast<T*>(target.data_ptr());
    A* pw = static_cast<A*>(weight.data_ptr());
    yolo_objectness<T><<<grid_for(predictions, kThreads), kThreads, 0, stream>>>(px, pb, pl, N, g, pt, pw, err);
    ENGINE_CUDA_LAUNCH_CHECK("yolo_targets (objectness)");
    const int threads = 64;
    yolo_positives<T><<<unsigned((N + threads - 1) / threads), threads, 0, stream>>>(pb, pl, N, g, pt, pw);
    ENGINE_CUDA_LAUNCH_CHECK("yolo_targets (positives)");
  });
  index_error_end("yolo_targets: labels", g.D - 5);
}

}  // namespace ops::cuda
