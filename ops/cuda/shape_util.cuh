// cuda/shape_util.cuh: host helpers shared by the shape kernels' launchers (shape.cu: copies and gathers;
// shape_scatter.cu: scatter-add): both describe an index along one dimension of a tensor.
#pragma once
#include "engine/tensor.h"

namespace ops::cuda {

inline int64_t prod(const engine::Shape& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t d = from; d < to; d++) p *= s[d];
  return p;
}

// True when index is a 1-D index along dim seen through expand_index (stride 0 everywhere else).
inline bool index_is_rows(const engine::Tensor& index, int64_t dim) {
  for (int64_t d = 0; d < index.dim(); d++)
    if (d != dim && index.strides()[size_t(d)] != 0 && index.shape()[size_t(d)] != 1) return false;
  return true;
}

// True when a and b have the same shape except along dim.
inline bool same_except(const engine::Shape& a, const engine::Shape& b, int64_t dim) {
  if (a.size() != b.size()) return false;
  for (size_t d = 0; d < a.size(); d++)
    if (int64_t(d) != dim && a[d] != b[d]) return false;
  return true;
}

}  // namespace ops::cuda
