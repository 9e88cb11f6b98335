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
// Bias: the BIAS epilogue adds bias[N] to every row of C (every column of C^T), in the same kernel; RELU_BIAS
// (RELU without a bias) also applies max(0, .) there, on the f32 accumulator before the rounding to C's type.
// Compute: f32 -> 32F (or 32F_FAST_TF32 when allowed), bf16/f16 -> 32F accumulate, f64 -> 64F.
// Algorithms: cuBLASLt's heuristic is asked once per problem (types, transposes, epilogue, layouts, alignment)
// and its answer kept for the process: a step repeats the same few dozen GEMMs, and the query costs the host
// tens of microseconds, more than some of the GEMMs take on the GPU.
#include "engine/cuda/runtime.h"
#include "ops/cuda/matmul.h"
#include "ops/matmul.h"  // kGemmWorkspaceBytes: the workspace every device reserves for these calls

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace ops::cuda {

using engine::DType;
using engine::Shape;
using engine::Tensor;

namespace {

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
  std::vector<int64_t> key;  // what the heuristic sees of it
  LtLayout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int32_t batch, int64_t stride)
      : key{int64_t(t), rows, cols, ld, batch, batch > 1 ? stride : 0} {
    ENGINE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&h, t, uint64_t(rows), uint64_t(cols), ld));
    if (batch > 1) {
      ENGINE_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
      ENGINE_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
  }
  ~LtLayout() { if (h) cublasLtMatrixLayoutDestroy(h); }
};

// One cuBLASLt GEMM of the dtype `t`, C^T[N, M] = B^T[N, K] A^T[K, M] (cuBLASLt's "A" is our b, its "B" our
// a): the descriptor (compute type: 64F for f64, 32F or FAST_TF32 for f32, 32F accumulate for bf16/f16; the
// operands' transposes; an optional bias epilogue), the preference (the device's GEMM workspace; the operands'
// alignment when they may be views at any element) and the algorithm cuBLASLt's heuristic picks. The handles
// are destroyed however the caller leaves (an error included).
class LtGemm {
 public:
  LtGemm(DType t, cublasOperation_t op_b, cublasOperation_t op_a) : dtype_(t) {
    const cublasComputeType_t compute = t == DType::f64 ? CUBLAS_COMPUTE_64F
                                        : (t == DType::f32 && engine::allow_tf32()) ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                                           : CUBLAS_COMPUTE_32F;
    ENGINE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, compute, t == DType::f64 ? CUDA_R_64F : CUDA_R_32F));
    ENGINE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof op_b));
    ENGINE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof op_a));
    key_ = {int64_t(t), int64_t(compute), int64_t(op_b), int64_t(op_a)};
    ENGINE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_));
    size_t ws_bytes = kGemmWorkspaceBytes;
    ENGINE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                             sizeof ws_bytes));
  }
  ~LtGemm() {
    if (pref_) cublasLtMatmulPreferenceDestroy(pref_);
    if (desc_) cublasLtMatmulDescDestroy(desc_);
  }
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // The GEMM's epilogue: bias[N] (if defined) added to every row of C, then max(0, .) with `relu`.
  void set_epilogue(const Tensor& bias, bool relu) {
    if (!bias.defined() && !relu) return;
    cublasLtEpilogue_t epi =
        bias.defined() ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS) : CUBLASLT_EPILOGUE_RELU;
    ENGINE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    key_.push_back(int64_t(epi));
    if (!bias.defined()) return;
    ENGINE_CHECK(bias.is_contiguous(), "cuda matmul: bias must be contiguous");
    const void* bp = bias.data_ptr();
    cudaDataType_t bt = data_type(bias.dtype());
    ENGINE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
    ENGINE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    key_.push_back(int64_t(bt));
  }
  // Operands that may start at any element (views): tell the heuristic each pointer's actual alignment (it
  // assumes 16 bytes otherwise), so that it picks a kernel that may read them.
  void align_to(const void* lt_a, const void* lt_b, const void* c) {
    auto alignment = [](const void* p) {
      uint32_t a = 16;
      while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
      return a;
    };
    const uint32_t al[4] = {alignment(lt_a), alignment(lt_b), alignment(c), alignment(c)};
    const cublasLtMatmulPreferenceAttributes_t attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) {
      ENGINE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref_, attr[i], &al[i], sizeof al[i]));
      key_.push_back(-int64_t(al[i]));  // negative: apart from the epilogue's entries
    }
  }
  // The algorithm for these layouts (cuBLASLt's A, B, C); `what` names the product in the error. Asked of
  // cuBLASLt once per distinct problem (the key: every attribute set above and the three layouts).
  void choose(const LtLayout& la, const LtLayout& lb, const LtLayout& lc, const std::string& what) {
    static std::mutex mutex;
    static std::map<std::vector<int64_t>, cublasLtMatmulHeuristicResult_t> known;
    std::vector<int64_t> key = key_;
    for (const LtLayout* l : {&la, &lb, &lc}) key.insert(key.end(), l->key.begin(), l->key.end());
    std::lock_guard<std::mutex> lock(mutex);
    auto it = known.find(key);
    if (it != known.end()) {
      heur_ = it->second;
      return;
    }
    int found = 0;
    ENGINE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(engine::cuda::cublaslt(), desc_, la.h, lb.h, lc.h, lc.h, pref_,
                                                       1, &heur_, &found));
    ENGINE_CHECK(found > 0, what, ": cuBLASLt has no algorithm for it in ", engine::dtype_name(dtype_));
    known.emplace(std::move(key), heur_);
  }
  // C = alpha op(A) op(B) + beta C, on the engine's stream, in the GEMM workspace of `device`.
  void run(engine::Device& device, double alpha, const void* lt_a, const LtLayout& la, const void* lt_b,
           const LtLayout& lb, double beta, void* c, const LtLayout& lc) {
    const engine::Device::Block& ws = device.workspace(kGemmWorkspaceBytes);
    const double a64 = alpha, b64 = beta;
    const float a32 = float(alpha), b32 = float(beta);
    const bool f64 = dtype_ == DType::f64;
    ENGINE_CUBLAS_CHECK(cublasLtMatmul(engine::cuda::cublaslt(), desc_, f64 ? static_cast<const void*>(&a64) : &a32,
                                       lt_a, la.h, lt_b, lb.h, f64 ? static_cast<const void*>(&b64) : &b32, c, lc.h,
                                       c, lc.h, &heur_.algo, device.pointer(ws.offset), kGemmWorkspaceBytes,
                                       engine::cuda::stream()));
  }

 private:
  DType dtype_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  cublasLtMatmulHeuristicResult_t heur_{};
  std::vector<int64_t> key_;  // the attributes set so far, for choose()
};

}  // namespace

void matmul(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out, bool relu) {
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  const Shape& os = out.shape();
  const int64_t nb = int64_t(os.size()) - 2;  // batch dimensions of out
  // Broadcast batch strides (elements) of each operand over out's batch shape.
  auto batch_strides = [&](const Tensor& t) {
    Shape st(size_t(nb), 0);
    int64_t lead = nb - (t.dim() - 2);
    for (int64_t i = 0; i < t.dim() - 2; i++)
      st[size_t(lead + i)] = t.shape()[size_t(i)] == 1 ? 0 : t.strides()[size_t(i)];
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
  // describe() returns the stored shape; cuBLASLt wants op(stored) = [N, K] for its A (our b) and [K, M] for
  // its B (our a). Stored row-major [K, N] = column-major [N, K] with op N: good. Transposed view: stored
  // column-major [K, N] and op T gives [N, K]. The same reasoning holds for a.
  cublasOperation_t op_b, op_a;
  int64_t rb, cb, ldb, ra, ca, lda;
  describe(K, N, b.strides()[size_t(b.dim() - 2)], b.strides()[size_t(b.dim() - 1)], &op_b, &rb, &cb, &ldb);
  describe(M, K, a.strides()[size_t(a.dim() - 2)], a.strides()[size_t(a.dim() - 1)], &op_a, &ra, &ca, &lda);
  LtGemm gemm(out.dtype(), op_b, op_a);
  gemm.set_epilogue(bias, relu);
  LtLayout la(t, rb, cb, ldb, inner, inner_b);  // cuBLASLt's A = our b
  LtLayout lb(t, ra, ca, lda, inner, inner_a);  // cuBLASLt's B = our a
  LtLayout lc(t, N, M, N, inner, inner_o);
  gemm.choose(la, lb, lc, engine::str("cuda matmul [", M, ", ", K, "] x [", K, ", ", N, "]"));
  const size_t es = engine::dtype_size(out.dtype());
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
    gemm.run(out.device(), 1.0, pb + ob * int64_t(es), la, pa + oa * int64_t(es), lb, 0.0, po + oo * int64_t(es), lc);
    for (int64_t d = int64_t(idx.size()) - 1; d >= 0; d--) {
      if (++idx[size_t(d)] < bs[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
  }
}

}  // namespace ops::cuda

namespace ops::cuda {

void matmul_accumulate(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta,
                       const Tensor& bias) {
  ENGINE_CHECK(a.dim() == 3 && out.dim() == 3 && (b.dim() == 2 || b.dim() == 3) && out.strides()[2] == 1,
               "cuda matmul_accumulate: expects a [batch, M, K], b [batch, K, N] or [K, N], out [batch, M, N] "
               "with unit column stride");
  const int64_t batch = out.size(0), M = out.size(1), N = out.size(2), K = a.size(2);
  if (batch == 0 || M == 0 || N == 0 || K == 0) return;
  const int64_t stride_a = a.strides()[0], stride_b = b.dim() == 3 ? b.strides()[0] : 0;
  const int64_t stride_o = out.strides()[0], ld_o = std::max<int64_t>(M == 1 ? N : out.strides()[1], N);

  cudaDataType_t t = data_type(out.dtype());
  cublasOperation_t op_b, op_a;  // as in matmul()
  int64_t rb, cb, ldb, ra, ca, lda;
  describe(K, N, b.strides()[size_t(b.dim() - 2)], b.strides()[size_t(b.dim() - 1)], &op_b, &rb, &cb, &ldb);
  describe(M, K, a.strides()[1], a.strides()[2], &op_a, &ra, &ca, &lda);
  LtGemm gemm(out.dtype(), op_b, op_a);
  gemm.set_epilogue(bias, false);
  gemm.align_to(b.data_ptr(), a.data_ptr(), out.data_ptr());  // a tap's rows start at any element
  LtLayout la(t, rb, cb, ldb, int32_t(batch), stride_b);
  LtLayout lb(t, ra, ca, lda, int32_t(batch), stride_a);
  LtLayout lc(t, N, M, ld_o, int32_t(batch), stride_o);
  gemm.choose(la, lb, lc, engine::str("cuda matmul_accumulate ", batch, " x [", M, ", ", K, "] x [", K, ", ", N, "]"));
  gemm.run(out.device(), alpha, b.data_ptr(), la, a.data_ptr(), lb, beta, out.data_ptr(), lc);
}

}  // namespace ops::cuda
