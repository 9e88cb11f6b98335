// cuda/matmul.cu: GEMMs through cuBLASLt, row-major tensors in, row-major tensors out.
//
// cuBLASLt is column-major. A row-major C[M, N] is a column-major C^T[N, M], and C = A B is C^T = B^T A^T:
// so we ask cuBLASLt for (B^T)(A^T) with the operands swapped, and describe each operand's storage as it is:
// a row-major matrix (unit stride along columns) is a column-major matrix of the transposed shape with
// ld = row stride; a transposed view (unit stride along rows) is a column-major matrix as it is.
// Batches: adjacent batch dimensions that every operand walks with one stride are merged; the innermost
// (merged) one goes to cuBLASLt as one strided-batched call, any outer ones loop on the host. (Attention's
// [B, H] head views cannot merge; ops/matmul.cpp hands such operands over as contiguous copies, because
// B host-side calls of H small GEMMs cost far more than the copy.)
// Bias: the BIAS epilogue adds bias[N] to every row of C (every column of C^T), in the same kernel.
// Compute: f32 -> 32F (or 32F_FAST_TF32 when allowed), bf16/f16 -> 32F accumulate, f64 -> 64F.
#include "engine/cuda/runtime.h"
#include "ops/cuda/matmul.h"

#include <cstdint>
#include <vector>

namespace ops::cuda {

using engine::DType;
using engine::Shape;
using engine::Tensor;

namespace {

constexpr size_t kWorkspace = size_t(32) << 20;

struct Operand {
  const char* ptr;
  cublasOperation_t op;  // as seen by cuBLASLt (column-major)
  int64_t rows, cols, ld;  // cuBLASLt's (column-major) shape of the stored matrix
};

cudaDataType_t data_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    case DType::f64: return CUDA_R_64F;
    default: throw engine::Error(engine::str("cuda matmul: dtype ", engine::dtype_name(t), " is not supported"));
  }
}

// The stored matrix of a row-major logical [R, C] view with strides (sr, sc), described for cuBLASLt.
// Returns op = N when it is stored row-major (column-major [C, R] with ld sr), T when stored as a transposed
// view (column-major [R, C] with ld sc).
void describe(int64_t R, int64_t C, int64_t sr, int64_t sc, cublasOperation_t* op, int64_t* rows, int64_t* cols,
              int64_t* ld) {
  if (sc == 1 || C == 1) {
    *op = CUBLAS_OP_N;
    *rows = C;
    *cols = R;
    *ld = std::max<int64_t>(R == 1 ? C : sr, std::max<int64_t>(C, 1));
  } else {
    ENGINE_CHECK(sr == 1 || R == 1, "cuda matmul: operand needs unit stride along rows or columns");
    *op = CUBLAS_OP_T;
    *rows = R;
    *cols = C;
    *ld = std::max<int64_t>(sc, std::max<int64_t>(R, 1));
  }
}

struct LtLayout {
  cublasLtMatrixLayout_t h = nullptr;
  LtLayout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int32_t batch, int64_t stride) {
    ENGINE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&h, t, uint64_t(rows), uint64_t(cols), ld));
    if (batch > 1) {
      ENGINE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
      ENGINE_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
  }
  ~LtLayout() { if (h) cublasLtMatrixLayoutDestroy(h); }
};

}  // namespace

void matmul(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out) {
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  const Shape& os = out.shape();
  const int64_t nb = int64_t(os.size()) - 2;  // batch dimensions of out
  // Broadcast batch strides (elements) of each operand over out's batch shape.
  auto batch_strides = [&](const Tensor& t) {
    Shape st(size_t(nb), 0);
    int64_t lead = nb - (t.dim() - 2);
    for (int64_t i = 0; i < t.dim() - 2; i++) st[size_t(lead + i)] = t.shape()[size_t(i)] == 1 ? 0 : t.strides()[size_t(i)];
    return st;
  };
  Shape sa = batch_strides(a), sb = batch_strides(b);
  Shape so = engine::contiguous_strides(os);
  Shape bs(os.begin(), os.end() - 2);  // batch sizes
  // Adjacent batch dimensions that all three operands walk with one stride merge into one (the op makes
  // attention's [B, H] head views contiguous for this), so one strided-batched call covers them.
  for (int64_t i = int64_t(bs.size()) - 2; i >= 0; i--) {
    const size_t d = size_t(i);
    auto joins = [&](const Shape& st) { return st[d] == st[d + 1] * bs[d + 1]; };
    if (joins(sa) && joins(sb) && joins(so)) {
      bs[d] *= bs[d + 1];
      for (Shape* st : {&sa, &sb, &so}) {
        (*st)[d] = (*st)[d + 1];
        st->erase(st->begin() + i + 1);
      }
      bs.erase(bs.begin() + i + 1);
    }
  }
  const int64_t mb = int64_t(bs.size());
  // The innermost (merged) batch dimension goes to cuBLASLt; the rest loop here.
  int32_t inner = mb > 0 ? int32_t(bs[size_t(mb - 1)]) : 1;
  int64_t inner_a = mb > 0 ? sa[size_t(mb - 1)] : 0, inner_b = mb > 0 ? sb[size_t(mb - 1)] : 0;
  int64_t inner_o = mb > 0 ? so[size_t(mb - 1)] : M * N;
  int64_t outer = 1;
  for (int64_t i = 0; i + 1 < mb; i++) outer *= bs[size_t(i)];
  if (M == 0 || N == 0 || outer == 0 || inner == 0) return;

  cudaDataType_t t = data_type(out.dtype());
  cublasComputeType_t compute = out.dtype() == DType::f64 ? CUBLAS_COMPUTE_64F
                                : (out.dtype() == DType::f32 && engine::cuda::allow_tf32()) ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                                             : CUBLAS_COMPUTE_32F;
  cudaDataType_t scale_type = out.dtype() == DType::f64 ? CUDA_R_64F : CUDA_R_32F;
  cublasLtMatmulDesc_t desc;
  ENGINE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, compute, scale_type));
  // C^T[N, M] = B^T[N, K] A^T[K, M]: cuBLASLt's "A" is our b, its "B" is our a.
  cublasOperation_t op_b, op_a;
  int64_t rb, cb, ldb, ra, ca, lda;
  describe(K, N, b.strides()[size_t(b.dim() - 2)], b.strides()[size_t(b.dim() - 1)], &op_b, &rb, &cb, &ldb);
  describe(M, K, a.strides()[size_t(a.dim() - 2)], a.strides()[size_t(a.dim() - 1)], &op_a, &ra, &ca, &lda);
  // describe() returns the stored shape; cuBLASLt wants op(stored) = [N, K] for its A and [K, M] for its B.
  // Stored row-major [K, N] = column-major [N, K] with op N: good. Transposed view: stored column-major
  // [K, N] and op T gives [N, K]. The same reasoning holds for a.
  ENGINE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof op_b));
  ENGINE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof op_a));
  if (bias.defined()) {
    ENGINE_CHECK(bias.is_contiguous(), "cuda matmul: bias must be contiguous");
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const void* bp = bias.data_ptr();
    ENGINE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    ENGINE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
    cudaDataType_t bt = data_type(bias.dtype());
    ENGINE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
  }
  LtLayout la(t, rb, cb, ldb, inner, inner_b);  // cuBLASLt's A = our b
  LtLayout lb(t, ra, ca, lda, inner, inner_a);  // cuBLASLt's B = our a
  LtLayout lc(t, N, M, N, inner, inner_o);

  const engine::Device::Block& ws = out.device().workspace(kWorkspace);
  void* ws_ptr = out.device().pointer(ws.offset);
  cublasLtMatmulPreference_t pref;
  ENGINE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws_bytes = kWorkspace;
  ENGINE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                           sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  ENGINE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(engine::cuda::cublaslt(), desc, la.h, lb.h, lc.h, lc.h, pref, 1,
                                                     &heur, &found));
  ENGINE_CHECK(found > 0, "cuda matmul: cuBLASLt has no algorithm for [", M, ", ", K, "] x [", K, ", ", N, "] in ",
               engine::dtype_name(out.dtype()));
  double alpha64 = 1.0, beta64 = 0.0;
  float alpha32 = 1.0f, beta32 = 0.0f;
  const void* alpha = out.dtype() == DType::f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = out.dtype() == DType::f64 ? static_cast<const void*>(&beta64) : &beta32;
  size_t es = engine::dtype_size(out.dtype());
  // Outer batch dimensions: walk them on the host.
  std::vector<int64_t> idx(size_t(std::max<int64_t>(mb - 1, 0)), 0);
  const char* pa = static_cast<const char*>(a.data_ptr());
  const char* pb = static_cast<const char*>(b.data_ptr());
  char* po = static_cast<char*>(out.data_ptr());
  for (int64_t n = 0; n < outer; n++) {
    int64_t oa = 0, ob = 0, oo = 0;
    for (size_t d = 0; d < idx.size(); d++) {
      oa += idx[d] * sa[d];
      ob += idx[d] * sb[d];
      oo += idx[d] * so[d];
    }
    ENGINE_CUBLAS_CHECK(cublasLtMatmul(engine::cuda::cublaslt(), desc, alpha, pb + ob * int64_t(es), la.h,
                                       pa + oa * int64_t(es), lb.h, beta, po + oo * int64_t(es), lc.h,
                                       po + oo * int64_t(es), lc.h, &heur.algo, ws_ptr, kWorkspace,
                                       engine::cuda::stream()));
    for (int64_t d = int64_t(idx.size()) - 1; d >= 0; d--) {
      if (++idx[size_t(d)] < bs[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatmulDescDestroy(desc);
}

}  // namespace ops::cuda

namespace ops::cuda {

void matmul_accumulate(const Tensor& a, const Tensor& b, const Tensor& out) {
  ENGINE_CHECK(a.dim() == 3 && out.dim() == 3 && (b.dim() == 2 || b.dim() == 3) && out.strides()[2] == 1,
               "cuda matmul_accumulate: expects a [batch, M, K], b [batch, K, N] or [K, N], out [batch, M, N] "
               "with unit column stride");
  const int64_t batch = out.size(0), M = out.size(1), N = out.size(2), K = a.size(2);
  if (batch == 0 || M == 0 || N == 0 || K == 0) return;
  const int64_t stride_a = a.strides()[0], stride_b = b.dim() == 3 ? b.strides()[0] : 0;
  const int64_t stride_o = out.strides()[0], ld_o = std::max<int64_t>(M == 1 ? N : out.strides()[1], N);

  cudaDataType_t t = data_type(out.dtype());
  cublasComputeType_t compute = out.dtype() == DType::f64 ? CUBLAS_COMPUTE_64F
                                : (out.dtype() == DType::f32 && engine::cuda::allow_tf32()) ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                                             : CUBLAS_COMPUTE_32F;
  cudaDataType_t scale_type = out.dtype() == DType::f64 ? CUDA_R_64F : CUDA_R_32F;
  cublasLtMatmulDesc_t desc;
  ENGINE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, compute, scale_type));
  // As in matmul(): C^T[N, M] = B^T[N, K] A^T[K, M], cuBLASLt's "A" is our b and its "B" our a.
  cublasOperation_t op_b, op_a;
  int64_t rb, cb, ldb, ra, ca, lda;
  describe(K, N, b.strides()[size_t(b.dim() - 2)], b.strides()[size_t(b.dim() - 1)], &op_b, &rb, &cb, &ldb);
  describe(M, K, a.strides()[1], a.strides()[2], &op_a, &ra, &ca, &lda);
  ENGINE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof op_b));
  ENGINE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof op_a));
  LtLayout la(t, rb, cb, ldb, int32_t(batch), stride_b);
  LtLayout lb(t, ra, ca, lda, int32_t(batch), stride_a);
  LtLayout lc(t, N, M, ld_o, int32_t(batch), stride_o);

  const engine::Device::Block& ws = out.device().workspace(kWorkspace);
  void* ws_ptr = out.device().pointer(ws.offset);
  cublasLtMatmulPreference_t pref;
  ENGINE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws_bytes = kWorkspace;
  ENGINE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                           sizeof ws_bytes));
  // Views into a tensor (a tap's rows) may start at any element: tell the heuristic each pointer's actual
  // alignment (it assumes 16 bytes otherwise) so that it picks a kernel that may read them.
  auto alignment = [](const void* p) {
    uint32_t a = 16;
    while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
    return a;
  };
  const uint32_t align_a = alignment(b.data_ptr()), align_b = alignment(a.data_ptr()), align_c = alignment(out.data_ptr());
  ENGINE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                           sizeof align_a));
  ENGINE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                           sizeof align_b));
  ENGINE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                           sizeof align_c));
  ENGINE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                                           sizeof align_c));
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  ENGINE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(engine::cuda::cublaslt(), desc, la.h, lb.h, lc.h, lc.h, pref, 1,
                                                     &heur, &found));
  ENGINE_CHECK(found > 0, "cuda matmul_accumulate: cuBLASLt has no algorithm for ", batch, " x [", M, ", ", K, "] x [",
               K, ", ", N, "] in ", engine::dtype_name(out.dtype()));
  double one64 = 1.0;
  float one32 = 1.0f;
  const void* one = out.dtype() == DType::f64 ? static_cast<const void*>(&one64) : &one32;  // alpha = beta = 1
  ENGINE_CUBLAS_CHECK(cublasLtMatmul(engine::cuda::cublaslt(), desc, one, b.data_ptr(), la.h, a.data_ptr(), lb.h, one,
                                     out.data_ptr(), lc.h, out.data_ptr(), lc.h, &heur.algo, ws_ptr, kWorkspace,
                                     engine::cuda::stream()));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatmulDescDestroy(desc);
}

}  // namespace ops::cuda
