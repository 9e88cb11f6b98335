// cpu/detection.cpp: the detection ops' reference loops: topk by sorting each row's keys, IoU pair by pair, and
// greedy NMS in score order (OpenMP over rows / images).
#include "ops/cpu/detection.h"

#include <algorithm>
#include <vector>

#include "ops/cpu/cpu_util.h"

namespace ops::cpu {

void topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices) {
  const int64_t N = x.size(0), K = x.size(1);
  int64_t* idx = indices.data<int64_t>();
  ENGINE_FLOAT_SWITCH(x.dtype(), T, {
    const T* in = x.data<T>();
    T* out = values.data<T>();
    parallel_for(N, [&](int64_t n) {
      std::vector<uint64_t> keys(static_cast<size_t>(K));
      for (int64_t i = 0; i < K; i++) keys[size_t(i)] = topk_key(float(ld(in[n * K + i])), i);
      std::partial_sort(keys.begin(), keys.begin() + k, keys.end(), std::greater<uint64_t>());
      for (int64_t j = 0; j < k; j++) {
        const int64_t i = topk_key_index(keys[size_t(j)]);
        idx[n * k + j] = i;
        out[n * k + j] = in[n * K + i];
      }
    });
  });
}

void box_iou(const Tensor& a, const Tensor& b, const Tensor& iou) {
  const int64_t N = a.size(0), A = a.size(1), B = b.size(1);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* out = iou.data<float>();
  parallel_for(N * A, [&](int64_t na) {
    const int64_t n = na / A;
    for (int64_t j = 0; j < B; j++) out[na * B + j] = box_iou_of(pa + na * 4, pb + (n * B + j) * 4);
  });
}

void nms(const Tensor& boxes, const Tensor& valid, float iou_threshold, const Tensor& keep) {
  const int64_t N = boxes.size(0), K = boxes.size(1), M = keep.size(1);
  const float* box = boxes.data<float>();
  const bool* ok = valid.defined() ? valid.data<bool>() : nullptr;
  int64_t* out = keep.data<int64_t>();
  parallel_for(N, [&](int64_t n) {
    std::vector<char> removed(size_t(K), 0);
    int64_t kept = 0;
    for (int64_t i = 0; i < K && kept < M; i++) {
      if ((ok && !ok[n * K + i]) || removed[size_t(i)]) continue;
      out[n * M + kept++] = i;
      const float* bi = box + (n * K + i) * 4;
      for (int64_t j = i + 1; j < K; j++)
        if (box_iou_of(bi, box + (n * K + j) * 4) > iou_threshold) removed[size_t(j)] = 1;
    }
    for (int64_t j = kept; j < M; j++) out[n * M + j] = -1;
  });
}

void box_code(bool decode, const Tensor& in, const Tensor& reference, const CoderWeights& w, const Tensor& image_hw,
              const Tensor& out) {
  const int64_t N = in.size(0), K = in.size(1);
  const float* x = in.data<float>();
  const float* r = reference.data<float>();
  const float* hw = image_hw.defined() ? image_hw.data<float>() : nullptr;
  float* y = out.data<float>();
  parallel_for(N * K, [&](int64_t i) {
    if (!decode) return encode_box(r + i * 4, x + i * 4, w, y + i * 4);
    const int64_t n = i / K;
    decode_box(r + i * 4, x + i * 4, w, hw != nullptr, hw ? hw[n * 2] : 0.f, hw ? hw[n * 2 + 1] : 0.f, y + i * 4);
  });
}

void match_boxes(const Tensor& iou, const Tensor& valid, float high, float low, bool allow_low_quality,
                 const Tensor& gmax, const Tensor& matches) {
  const int64_t N = iou.size(0), G = iou.size(1), A = iou.size(2);
  const float* q = iou.data<float>();
  const bool* ok = valid.defined() ? valid.data<bool>() : nullptr;
  float* best = gmax.data<float>();
  int64_t* m = matches.data<int64_t>();
  parallel_for(N * G, [&](int64_t ng) {
    float v = -1.f;
    for (int64_t a = 0; a < A; a++) v = q[ng * A + a] > v ? q[ng * A + a] : v;
    best[ng] = v;
  });
  parallel_for(N * A, [&](int64_t na) {
    const int64_t n = na / A, a = na % A;
    m[na] = match_anchor(q + n * G * A, G, A, a, best + n * G, ok ? ok + n * G : nullptr, high, low, allow_low_quality);
  });
}

void polygon_masks(const Tensor& polygons, const Tensor& counts, const Tensor& rois, const Tensor& truth,
                   const Tensor& masks) {
  const int64_t N = polygons.size(0), G = polygons.size(1), P = polygons.size(2), V = polygons.size(3);
  const int64_t R = rois.size(1), M = masks.size(2);
  const float* poly = polygons.data<float>();
  const int64_t* count = counts.data<int64_t>();
  const float* box = rois.data<float>();
  const int64_t* which = truth.data<int64_t>();
  float* out = masks.data<float>();
  for (int64_t n = 0; n < N; n++)
    for (int64_t r = 0; r < R; r++) {
      const float* b = box + (n * R + r) * 4;
      const int64_t g = which[n * R + r];
      const float w = std::max(sub_rn(b[2], b[0]), 1.f), h = std::max(sub_rn(b[3], b[1]), 1.f);
      float* crop = out + (n * R + r) * M * M;
      for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < M; j++)
          crop[i * M + j] = g < 0 || g >= G
                                ? 0.f
                                : polygon_mask_pixel(poly + (n * G + g) * P * V * 2, count + (n * G + g) * P, P, V,
                                                     b[0], b[1], w, h, M, i, j);
    }
}

}  // namespace ops::cpu
