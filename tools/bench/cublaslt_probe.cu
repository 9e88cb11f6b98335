// cublaslt_probe.cu: times the cuBLASLt calls behind two of issue 20's levers, outside the engine, so that the
// choice is measured before it is built.
//   1. A linear's weight gradient with its bias gradient in the GEMM's epilogue (BGRADB), against the GEMM alone
//      (the engine then sums the bias gradient in a second kernel): bert_base's three weight shapes at 512 x 32.
//   3. A linear with relu in its epilogue (RELU_BIAS) against the bias alone (BIAS), each with cuBLASLt's first
//      eight candidates: transformer_big's first feed-forward product and Mask R-CNN's box head.
//   4. (`candidates`) How far cuBLASLt's first choice is from the fastest of its first eight candidates, for the
//      forward, dx and dW products of bert_base's, BERT-Large's and transformer_big's linears.
//   5. (`gelu`) Which GELU cuBLASLt's GELU epilogues compute, BERT's erf form or GPT-2's tanh form, on exact f32
//      inputs (the forward GELU and the backward DGELU's derivative, each against both forms in double), and what
//      GELU_AUX_BIAS (the forward keeping its pre-activation) and DGELU / DGELU_BGRAD (the backward) cost against
//      BIAS / DEFAULT at bert_base's feed-forward shapes.
//   6. (`heuristic`) What a product of a shape not seen before costs the host: cuBLASLt's algorithm query
//      (cublasLtMatmulAlgoGetHeuristic, asked once per shape as ops/cuda/matmul.cu does) against the rest of the
//      call (descriptor, layouts, cublasLtMatmul's launch), for convs2s's and mtdnn's products at row counts that
//      change batch to batch; the median over the shapes, microseconds of host time.
//   2. BERT's vocabulary projection ([2464, 768] x [768, 30522], its backward GEMMs too) with the logits' rows 30522
//      elements apart (61044 bytes: 4-byte aligned) against rows padded to 30528 (16-byte aligned), and against a
//      vocabulary padded to 30528 words.
// Build and run on the GPU machine:
//   nvcc -O2 -std=c++17 -arch=sm_90 tools/bench/cublaslt_probe.cu -lcublasLt -o p && ./p [relu | candidates | gelu |
//   heuristic]
// Prints the median of 20 timed calls (CUDA events) per variant, and checks the epilogue's bias gradient against
// a column sum on the host.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#define CK(x)                                                   \
  do {                                                          \
    cudaError_t e_ = (x);                                       \
    if (e_ != cudaSuccess) {                                    \
      std::printf("CUDA %s: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                             \
    }                                                           \
  } while (0)
#define LT(x)                                        \
  do {                                               \
    cublasStatus_t s_ = (x);                         \
    if (s_ != CUBLAS_STATUS_SUCCESS) {               \
      std::printf("cuBLASLt %s: %d\n", #x, int(s_)); \
      std::exit(1);                                  \
    }                                                \
  } while (0)

namespace {

cublasLtHandle_t g_lt;
void* g_ws;
constexpr size_t kWs = size_t(32) << 20;

struct Mat {  // a column-major cuBLASLt operand
  const void* p;
  cublasOperation_t op;
  int64_t rows, cols, ld;  // stored shape
};

// D[m, n] (column-major, ld ldd) = op(A) op(B) (+ epilogue), bf16 in and out, f32 accumulate, with the heuristic's
// candidate `candidate` (0: its first choice, the engine's). Returns the median ms of 20 calls, or -1 when cuBLASLt
// has no such candidate.
double time_gemm(const Mat& a, const Mat& b, void* d, int64_t m, int64_t n, int64_t ldd, cublasLtEpilogue_t epi,
                 void* bias, char* algo_name = nullptr, int candidate = 0, void* aux = nullptr) {
  cublasLtMatmulDesc_t desc;
  LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &a.op, sizeof a.op));
  LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &b.op, sizeof b.op));
  LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (bias) {
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    cudaDataType_t bt = CUDA_R_16BF;
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
  }
  if (aux) {  // the pre-activation, laid out as D
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldd, sizeof ldd));
  }
  cublasLtMatrixLayout_t la, lb, ld;
  LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, a.rows, a.cols, a.ld));
  LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, b.rows, b.cols, b.ld));
  LT(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, ldd));
  cublasLtMatmulPreference_t pref;
  LT(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWs;
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t results[8]{};
  int found = 0;
  cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, lb, ld, ld, pref, 8, results, &found);
  const cublasLtMatmulHeuristicResult_t& heur = results[candidate];
  double med = -1;
  if (s == CUBLAS_STATUS_SUCCESS && found > candidate) {
    const float one = 1, zero = 0;
    auto call = [&] {
      LT(cublasLtMatmul(g_lt, desc, &one, a.p, la, b.p, lb, &zero, d, ld, d, ld, &heur.algo, g_ws, kWs, 0));
    };
    for (int i = 0; i < 3; i++) call();
    std::vector<float> ms;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 20; i++) {
      CK(cudaEventRecord(e0));
      call();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float t;
      CK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    med = ms[ms.size() / 2];
    if (algo_name) {
      int id = 0, tile = 0, splitk = 0;
      size_t w;
      cublasLtMatmulAlgoConfigGetAttribute(&heur.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
      cublasLtMatmulAlgoConfigGetAttribute(&heur.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
      cublasLtMatmulAlgoConfigGetAttribute(&heur.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
      std::snprintf(algo_name, 64, "algo %d tile %d splitK %d", id, tile, splitk);
    }
  } else if (algo_name) {
    std::snprintf(algo_name, 64, "no algorithm (status %d)", int(s));
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  return med;
}

__nv_bfloat16* random_bf16(size_t n, unsigned seed) {
  std::vector<__nv_bfloat16> h(n);
  srand(seed);
  for (auto& v : h) v = __float2bfloat16(float(rand()) / RAND_MAX - 0.5f);
  __nv_bfloat16* d;
  CK(cudaMalloc(&d, n * sizeof(__nv_bfloat16)));
  CK(cudaMemcpy(d, h.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  return d;
}

double tflops(double m, double n, double k, double ms) { return 2 * m * n * k / ms / 1e9; }

// Weight gradient of a linear [R, in] -> [R, out]: dW[out, in] = g^T x, as the engine asks cuBLASLt for it
// (column-major D [in, out] = x^T-as-stored (op N) times g stored [out, R] (op T)); with and without BGRADB.
void weight_grad(int64_t R, int64_t in, int64_t out, int64_t g_ld) {
  __nv_bfloat16* x = random_bf16(size_t(R * in), 1);
  __nv_bfloat16* g = random_bf16(size_t(R * g_ld), 2);
  __nv_bfloat16 *dw, *db;
  CK(cudaMalloc(&dw, size_t(out * in) * 2));
  CK(cudaMalloc(&db, size_t(out) * 2));
  Mat a{x, CUBLAS_OP_N, in, R, in}, b{g, CUBLAS_OP_T, out, R, g_ld};
  char n0[64], n1[64];
  const double plain = time_gemm(a, b, dw, in, out, in, CUBLASLT_EPILOGUE_DEFAULT, nullptr, n0);
  const double fused = time_gemm(a, b, dw, in, out, in, CUBLASLT_EPILOGUE_BGRADB, db, n1);
  // Check the bias gradient: sum over R of g's column o.
  std::vector<__nv_bfloat16> hg(static_cast<size_t>(R * g_ld)), hb(static_cast<size_t>(out));
  CK(cudaMemcpy(hg.data(), g, hg.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hb.data(), db, hb.size() * 2, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int64_t o = 0; o < out; o++) {
    double s = 0;
    for (int64_t r = 0; r < R; r++) s += double(__bfloat162float(hg[size_t(r * g_ld + o)]));
    worst = std::max(worst, std::abs(s - double(__bfloat162float(hb[size_t(o)]))) / (1 + std::abs(s)));
  }
  std::printf(
      "dW [%lld, %lld] over %lld rows (g ld %lld): plain %.3f ms (%.0f TFLOP/s, %s) | BGRADB %.3f ms "
      "(%.0f TFLOP/s, %s) | bias grad rel err %.2e\n",
      (long long)out, (long long)in, (long long)R, (long long)g_ld, plain, tflops(R, in, out, plain), n0, fused,
      fused > 0 ? tflops(R, in, out, fused) : 0.0, n1, fused > 0 ? worst : -1.0);
  CK(cudaFree(x));
  CK(cudaFree(g));
  CK(cudaFree(dw));
  CK(cudaFree(db));
}

// y[R, out] = x[R, in] W[out, in]^T + b, then relu (RELU_BIAS) or not (BIAS), as the engine asks for it (D[out, R]
// = W-as-stored [in, out] op T, x-as-stored [in, R] op N), with each of cuBLASLt's first eight candidates.
void relu_epilogue(int64_t R, int64_t in, int64_t out) {
  __nv_bfloat16* x = random_bf16(size_t(R * in), 7);
  __nv_bfloat16* w = random_bf16(size_t(out * in), 8);
  __nv_bfloat16* b = random_bf16(size_t(out), 9);
  __nv_bfloat16* y;
  CK(cudaMalloc(&y, size_t(R * out) * 2));
  for (cublasLtEpilogue_t epi : {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_RELU_BIAS}) {
    std::printf("[%lld, %lld] x [%lld, %lld]^T %s:", (long long)R, (long long)in, (long long)out, (long long)in,
                epi == CUBLASLT_EPILOGUE_BIAS ? "BIAS" : "RELU_BIAS");
    for (int c = 0; c < 8; c++) {
      char name[64];
      const double ms =
          time_gemm(Mat{w, CUBLAS_OP_T, in, out, in}, Mat{x, CUBLAS_OP_N, in, R, in}, y, out, R, out, epi, b, name, c);
      if (ms < 0) break;
      std::printf(" | #%d %.3f ms (%.0f TFLOP/s, %s)", c, ms, tflops(R, in, out, ms), name);
    }
    std::printf("\n");
  }
  for (void* p : {(void*)x, (void*)w, (void*)b, (void*)y}) CK(cudaFree(p));
}

// The fastest of the first eight candidates against the first: returns {first ms, best ms}, prints both.
std::pair<double, double> best_candidate(const char* what, const Mat& a, const Mat& b, void* d, int64_t m, int64_t n,
                                         int64_t ldd, cublasLtEpilogue_t epi, void* bias, double flops) {
  double first = -1, best = 1e30;
  int best_c = 0;
  for (int c = 0; c < 8; c++) {
    const double ms = time_gemm(a, b, d, m, n, ldd, epi, bias, nullptr, c);
    if (ms < 0) break;
    if (c == 0) first = ms;
    if (ms < best) best = ms, best_c = c;
  }
  std::printf("  %-4s first %.4f ms (%.0f TFLOP/s) | fastest #%d %.4f ms (%.0f TFLOP/s) | %.1f%%\n", what, first,
              flops / first / 1e9, best_c, best, flops / best / 1e9, 100.0 * (first - best) / first);
  return {first, best};
}

// A linear [R, in] -> [R, out]: forward (with its bias), dx and dW as the engine asks for them.
std::pair<double, double> linear_candidates(int64_t R, int64_t in, int64_t out) {
  __nv_bfloat16* x = random_bf16(size_t(R * in), 10);
  __nv_bfloat16* w = random_bf16(size_t(out * in), 11);
  __nv_bfloat16* b = random_bf16(size_t(out), 12);
  __nv_bfloat16* g = random_bf16(size_t(R * out), 13);
  __nv_bfloat16 *y, *dx, *dw;
  CK(cudaMalloc(&y, size_t(R * out) * 2));
  CK(cudaMalloc(&dx, size_t(R * in) * 2));
  CK(cudaMalloc(&dw, size_t(out * in) * 2));
  const double flops = 2.0 * double(R) * double(in) * double(out);
  std::printf("linear [%lld, %lld] -> %lld\n", (long long)R, (long long)in, (long long)out);
  std::pair<double, double> sum{0, 0};
  for (auto r : {best_candidate("fwd", Mat{w, CUBLAS_OP_T, in, out, in}, Mat{x, CUBLAS_OP_N, in, R, in}, y, out, R,
                                out, CUBLASLT_EPILOGUE_BIAS, b, flops),
                 best_candidate("dx", Mat{w, CUBLAS_OP_N, in, out, in}, Mat{g, CUBLAS_OP_N, out, R, out}, dx, in, R,
                                in, CUBLASLT_EPILOGUE_DEFAULT, nullptr, flops),
                 best_candidate("dW", Mat{x, CUBLAS_OP_N, in, R, in}, Mat{g, CUBLAS_OP_T, out, R, out}, dw, in, out,
                                in, CUBLASLT_EPILOGUE_DEFAULT, nullptr, flops)})
    sum.first += r.first, sum.second += r.second;
  for (void* p : {(void*)x, (void*)w, (void*)b, (void*)g, (void*)y, (void*)dx, (void*)dw}) CK(cudaFree(p));
  return sum;
}

// Runs D[m, 1] = A[m, 1] * 1 with epilogue `epi` in f32 (inputs exact), aux the pre-activation for DGELU.
std::vector<float> gelu_epilogue_f32(const std::vector<float>& a, cublasLtEpilogue_t epi,
                                     const std::vector<float>& aux) {
  const int64_t m = int64_t(a.size()), one_ld = 1;
  float *da, *db, *dd, *daux = nullptr;
  CK(cudaMalloc(&da, a.size() * 4));
  CK(cudaMalloc(&db, 4));
  CK(cudaMalloc(&dd, a.size() * 4));
  CK(cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
  const float unit = 1;
  CK(cudaMemcpy(db, &unit, 4, cudaMemcpyHostToDevice));
  cublasLtMatmulDesc_t desc;
  LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (!aux.empty()) {
    CK(cudaMalloc(&daux, aux.size() * 4));
    CK(cudaMemcpy(daux, aux.data(), aux.size() * 4, cudaMemcpyHostToDevice));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &daux, sizeof daux));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &m, sizeof m));
  }
  cublasLtMatrixLayout_t la, lb, ld;
  LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, m, 1, m));
  LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 1, 1, one_ld));
  LT(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, 1, m));
  const float alpha = 1, beta = 0;
  LT(cublasLtMatmul(g_lt, desc, &alpha, da, la, db, lb, &beta, dd, ld, dd, ld, nullptr, g_ws, kWs, 0));
  std::vector<float> d(a.size());
  CK(cudaMemcpy(d.data(), dd, d.size() * 4, cudaMemcpyDeviceToHost));
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  for (float* p : {da, db, dd, daux})
    if (p) CK(cudaFree(p));
  return d;
}

// Lever 5: GELU's form in cuBLASLt's epilogues, then their cost at bert_base's feed-forward shapes (512 x 32).
void gelu_epilogues() {
  std::vector<float> x;
  for (int i = 0; i < 4096; i++) x.push_back(-6.0f + 12.0f * float(i) / 4095.0f);
  const auto erf_gelu = [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); };
  const auto erf_dgelu = [](double v) {
    return 0.5 * (1 + std::erf(v / std::sqrt(2.0))) + v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
  };
  const double c = std::sqrt(2 / M_PI), k = 0.044715;
  const auto tanh_gelu = [&](double v) { return 0.5 * v * (1 + std::tanh(c * (v + k * v * v * v))); };
  const auto tanh_dgelu = [&](double v) {
    const double t = std::tanh(c * (v + k * v * v * v));
    return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * k * v * v);
  };
  const std::vector<float> y = gelu_epilogue_f32(x, CUBLASLT_EPILOGUE_GELU, {});
  const std::vector<float> dy = gelu_epilogue_f32(std::vector<float>(x.size(), 1.0f), CUBLASLT_EPILOGUE_DGELU, x);
  double e[4] = {0, 0, 0, 0};  // GELU vs erf, vs tanh; DGELU vs erf, vs tanh
  for (size_t i = 0; i < x.size(); i++) {
    e[0] = std::max(e[0], std::abs(y[i] - erf_gelu(x[i])));
    e[1] = std::max(e[1], std::abs(y[i] - tanh_gelu(x[i])));
    e[2] = std::max(e[2], std::abs(dy[i] - erf_dgelu(x[i])));
    e[3] = std::max(e[3], std::abs(dy[i] - tanh_dgelu(x[i])));
  }
  std::printf("GELU epilogue on 4096 exact f32 inputs in [-6, 6]: max |y - erf form| %.3e, max |y - tanh form| %.3e\n",
              e[0], e[1]);
  std::printf("DGELU epilogue (derivative): max |d - erf form| %.3e, max |d - tanh form| %.3e\n", e[2], e[3]);
  // Cost, bf16: the intermediate linear [16384, 768] -> 3072 with BIAS / GELU_AUX_BIAS (pre-activation kept), and the
  // output linear's dx [16384, 768] -> 3072 with DEFAULT / DGELU / DGELU_BGRAD (the intermediate's bias gradient).
  const int64_t R = 16384, C = 768, F = 3072;
  __nv_bfloat16* x1 = random_bf16(size_t(R * C), 20);
  __nv_bfloat16* w1 = random_bf16(size_t(F * C), 21);
  __nv_bfloat16* b1 = random_bf16(size_t(F), 22);
  __nv_bfloat16* w2 = random_bf16(size_t(C * F), 23);
  __nv_bfloat16* g2 = random_bf16(size_t(R * C), 24);
  __nv_bfloat16 *h, *y1, *dh, *db1;
  CK(cudaMalloc(&h, size_t(R * F) * 2));
  CK(cudaMalloc(&y1, size_t(R * F) * 2));
  CK(cudaMalloc(&dh, size_t(R * F) * 2));
  CK(cudaMalloc(&db1, size_t(F) * 2));
  char n[4][64];
  const Mat w1t{w1, CUBLAS_OP_T, C, F, C}, xn{x1, CUBLAS_OP_N, C, R, C};
  const double fb = time_gemm(w1t, xn, h, F, R, F, CUBLASLT_EPILOGUE_BIAS, b1, n[0]);
  const double fg = time_gemm(w1t, xn, y1, F, R, F, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, b1, n[1], 0, h);
  std::printf("forward [%lld, %lld] -> %lld: BIAS %.3f ms (%s) | GELU_AUX_BIAS %.3f ms (%s)\n", (long long)R,
              (long long)C, (long long)F, fb, n[0], fg, n[1]);
  // dx of the output linear [R, F] -> [R, C]: D[F, R] = W2-as-stored [F, C] op N, g-as-stored [C, R] op N.
  const Mat w2n{w2, CUBLAS_OP_N, F, C, F}, gn{g2, CUBLAS_OP_N, C, R, C};
  const double bd = time_gemm(w2n, gn, dh, F, R, F, CUBLASLT_EPILOGUE_DEFAULT, nullptr, n[0]);
  const double bg = time_gemm(w2n, gn, dh, F, R, F, CUBLASLT_EPILOGUE_DGELU, nullptr, n[1], 0, h);
  const double bgb = time_gemm(w2n, gn, dh, F, R, F, CUBLASLT_EPILOGUE_DGELU_BGRAD, db1, n[2], 0, h);
  std::printf("backward dx [%lld, %lld] -> %lld: DEFAULT %.3f ms (%s) | DGELU %.3f ms (%s) | DGELU_BGRAD %.3f ms "
              "(%s)\n",
              (long long)R, (long long)C, (long long)F, bd, n[0], bg, n[1], bgb, n[2]);
  for (void* p : {(void*)x1, (void*)w1, (void*)b1, (void*)w2, (void*)g2, (void*)h, (void*)y1, (void*)dh, (void*)db1})
    CK(cudaFree(p));
}

// The vocabulary projection y[R, V] = x[R, C] W[V, C]^T + b and its two backward GEMMs, y's (and g's) rows ld apart.
void vocab(int64_t R, int64_t C, int64_t V, int64_t ld) {
  __nv_bfloat16* x = random_bf16(size_t(R * C), 3);
  __nv_bfloat16* w = random_bf16(size_t(V * C), 4);
  __nv_bfloat16* b = random_bf16(size_t(V), 5);
  __nv_bfloat16* y = random_bf16(size_t(R * ld), 6);  // also serves as g
  __nv_bfloat16 *dx, *dw;
  CK(cudaMalloc(&dx, size_t(R * C) * 2));
  CK(cudaMalloc(&dw, size_t(V * C) * 2));
  char n0[64], n1[64], n2[64];
  // forward: D[V, R] (ld) = W-as-stored [C, V] op T, x-as-stored [C, R] op N
  const double fwd =
      time_gemm(Mat{w, CUBLAS_OP_T, C, V, C}, Mat{x, CUBLAS_OP_N, C, R, C}, y, V, R, ld, CUBLASLT_EPILOGUE_BIAS, b, n0);
  // dx: D[C, R] = W-as-stored [C, V] op N, g-as-stored [V, R] (ld) op N
  const double dxt = time_gemm(Mat{w, CUBLAS_OP_N, C, V, C}, Mat{y, CUBLAS_OP_N, V, R, ld}, dx, C, R, C,
                               CUBLASLT_EPILOGUE_DEFAULT, nullptr, n1);
  // dW: D[C, V] = x-as-stored [C, R] op N, g-as-stored [V, R] (ld) op T
  const double dwt = time_gemm(Mat{x, CUBLAS_OP_N, C, R, C}, Mat{y, CUBLAS_OP_T, V, R, ld}, dw, C, V, C,
                               CUBLASLT_EPILOGUE_DEFAULT, nullptr, n2);
  std::printf(
      "vocab [%lld, %lld] x [%lld, %lld]^T, rows %lld apart: forward+bias %.3f ms (%.0f TFLOP/s, %s) | dx %.3f "
      "(%.0f, %s) | dW %.3f (%.0f, %s)\n",
      (long long)R, (long long)C, (long long)V, (long long)C, (long long)ld, fwd, tflops(R, C, V, fwd), n0, dxt,
      tflops(R, C, V, dxt), n1, dwt, tflops(R, C, V, dwt), n2);
  for (void* p : {(void*)x, (void*)w, (void*)b, (void*)y, (void*)dx, (void*)dw}) CK(cudaFree(p));
}

}  // namespace

// Host microseconds of one bf16 product y[R, out] = x[R, in] W (as the engine's linear asks for it), split into
// cuBLASLt's algorithm query and the rest (descriptor, preference, layouts, cublasLtMatmul's launch), for each row
// count in `rows` (each new to cuBLASLt's heuristic); then the same shapes again with the query's answer reused
// (the engine's cache). Prints the medians over the row counts.
void heuristic_cost(const char* what, const std::vector<int64_t>& rows, int64_t in, int64_t out) {
  const int64_t R_max = *std::max_element(rows.begin(), rows.end());
  __nv_bfloat16* x = random_bf16(size_t(R_max * in), 20);
  __nv_bfloat16* w = random_bf16(size_t(out * in), 21);
  __nv_bfloat16* y;
  CK(cudaMalloc(&y, size_t(R_max * out) * 2));
  using clock = std::chrono::steady_clock;
  auto us = [](clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  std::vector<double> query, rest, cached;
  std::vector<cublasLtMatmulHeuristicResult_t> known(rows.size());
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < rows.size(); i++) {
      const int64_t R = rows[i];
      const auto t0 = clock::now();
      cublasLtMatmulDesc_t desc;
      LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
      LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t));
      LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n));
      cublasLtMatrixLayout_t la, lb, ld;
      LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, in, out, in));
      LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, in, R, in));
      LT(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, out, R, out));
      cublasLtMatmulPreference_t pref;
      LT(cublasLtMatmulPreferenceCreate(&pref));
      size_t ws = kWs;
      LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
      const auto t1 = clock::now();
      if (pass == 0) {
        int found = 0;
        LT(cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, lb, ld, ld, pref, 1, &known[i], &found));
        if (found == 0) std::printf("no algorithm for %lld rows\n", (long long)R);
      }
      const auto t2 = clock::now();
      const float one = 1, zero = 0;
      LT(cublasLtMatmul(g_lt, desc, &one, w, la, x, lb, &zero, y, ld, y, ld, &known[i].algo, g_ws, kWs, 0));
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(la);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(ld);
      cublasLtMatmulDescDestroy(desc);
      const auto t3 = clock::now();
      if (pass == 0) {
        query.push_back(us(t1, t2));
        rest.push_back(us(t0, t1) + us(t2, t3));
      } else {
        cached.push_back(us(t0, t3));
      }
      CK(cudaDeviceSynchronize());  // the host times alone, not queued behind the GPU
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf(
      "%s [R, %lld] -> %lld over %zu row counts: query %.1f us (max %.1f), rest %.1f us; shapes known: "
      "%.1f us a product\n",
      what, (long long)in, (long long)out, rows.size(), median(query), *std::max_element(query.begin(), query.end()),
      median(rest), median(cached));
  for (void* p : {(void*)x, (void*)w, (void*)y}) CK(cudaFree(p));
}

int main(int argc, char** argv) {
  LT(cublasLtCreate(&g_lt));
  CK(cudaMalloc(&g_ws, kWs));
  if (argc > 1 && std::string(argv[1]) == "relu") {  // lever 3 only
    relu_epilogue(8192, 1024, 4096);                 // transformer_big --tokens 8192: fc1
    relu_epilogue(1024, 12544, 1024);                // Mask R-CNN batch 2: fc6 over 2 x 512 RoIs
    relu_epilogue(1024, 1024, 1024);                 // fc7
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "heuristic") {  // 6 only
    std::vector<int64_t> convs2s_rows, mtdnn_rows;
    for (int64_t r = 3900; r < 4000; r += 7) convs2s_rows.push_back(r);    // token budgets' row counts
    for (int64_t l = 128; l <= 512; l += 24) mtdnn_rows.push_back(8 * l);  // 8 rows padded to the longest
    heuristic_cost("convs2s conv tap", convs2s_rows, 512, 1024);
    heuristic_cost("convs2s conv tap", convs2s_rows, 1024, 2048);
    heuristic_cost("mtdnn qkv", mtdnn_rows, 1024, 3072);
    heuristic_cost("mtdnn ffn", mtdnn_rows, 1024, 4096);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "gelu") {  // lever 5 only
    gelu_epilogues();
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "candidates") {  // lever 4 only; per model, one layer's products
    struct Layer {
      const char* model;
      int64_t R, in, out, per_layer;
    };
    const Layer layers[] = {{"bert_base", 16384, 768, 2304, 1},  {"bert_base", 16384, 768, 768, 1},
                            {"bert_base", 16384, 768, 3072, 1},  {"bert_base", 16384, 3072, 768, 1},
                            {"mtdnn", 4096, 1024, 3072, 1},      {"mtdnn", 4096, 1024, 1024, 1},
                            {"mtdnn", 4096, 1024, 4096, 1},      {"mtdnn", 4096, 4096, 1024, 1},
                            {"transformer_big", 8192, 1024, 3072, 1}, {"transformer_big", 8192, 1024, 1024, 2},
                            {"transformer_big", 8192, 1024, 4096, 1}, {"transformer_big", 8192, 4096, 1024, 1}};
    double first = 0, best = 0;
    const char* model = layers[0].model;
    for (const Layer& l : layers) {
      if (std::string(l.model) != model) {
        std::printf("%s, one layer: first choices %.3f ms, fastest %.3f ms (%.1f%%)\n", model, first, best,
                    100 * (first - best) / first);
        first = best = 0, model = l.model;
      }
      std::printf("%s ", l.model);
      const auto r = linear_candidates(l.R, l.in, l.out);
      first += double(l.per_layer) * r.first, best += double(l.per_layer) * r.second;
    }
    std::printf("%s, one layer: first choices %.3f ms, fastest %.3f ms (%.1f%%)\n", model, first, best,
                100 * (first - best) / first);
    return 0;
  }
  const int64_t R = 16384;           // bert_base 512 x 32
  weight_grad(R, 768, 768, 768);     // query, key, value, attention output
  weight_grad(R, 768, 3072, 3072);   // intermediate
  weight_grad(R, 3072, 768, 768);    // output
  weight_grad(R, 768, 2304, 2304);   // query, key and value as one projection
  weight_grad(R, 1024, 1024, 1024);  // BERT-Large
  weight_grad(R, 1024, 4096, 4096);
  weight_grad(R, 4096, 1024, 1024);
  vocab(2464, 768, 30522, 30522);  // 77 masked positions x 32
  vocab(2464, 768, 30522, 30528);
  vocab(2464, 768, 30528, 30528);  // the vocabulary itself padded to a multiple of 8 (6 unused rows of W)
  return 0;
}
