// cuda/conv_winograd.cu: true-fp32 3x3 stride-1 convolutions by Winograd's F(2x2, 3x3) (when: ops/conv_params.h's
// conv2d_winograd). Every pass is transforms (these kernels, memory-bound, a thread per tile and 4 channels, float4
// loads and stores) around 16 GEMMs on cuBLASLt (ops::cuda::matmul, true fp32: CUBLAS_COMPUTE_32F with TF32 off):
//   forward  V = B^T d B (x's 4x4 patches), U = G g G^T (the filters), M[p] = V[p] U[p]^T, y = A^T M A (+ bias)
//   data     the forward of dy with the filters turned by 180 degrees, padding 2 d - p: V from dy, U from the turned
//            filters, M[p] = V[p] U[p] (U [Cout, Cin] is already the [K, N] operand), dx = A^T M A
//   weight   V from x, Y = A dY A^T (dy's 2x2 tiles, zeros past the output), dU[p][s] = Y[p]^T V[p] summed over
//            piece s of the tiles (and over the chunks of images, beta = 1), dw = G^T (sum over s of dU[p][s]) G
// with the 1-D matrices of F(2, 3): B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5; .5 -.5 .5;
// 0 0 1], A^T = [1 1 1 0; 0 1 -1 -1]. Position p = 4 i + j of a 4x4 transform. A tile is outputs (o_h + d_h i, o_w +
// d_w j), i, j in {0, 1}, of one image; tile (a, b) of an axis with dilation d starts at o = a % d + 2 d (a / d)
// (winograd_tiles in conv_params.h), its patch reads inputs o - pad + d e, e in 0..3, zeros outside the input.
// Tiles index [image][a][b] over the batch; the workspace holds U [16, Cout, Cin] (the weight gradient: dU [16,
// splits, Cout, Cin]), then V [16, rows, C_in] and M (or Y) [16, rows, C_out] for a chunk of tiles (a range of that
// index, which may cut an image: the kernels take the chunk's first tile and find each tile's image), rows = its tiles
// rounded up to a multiple of the pieces, the rows past the tiles zeros (the last chunk may be smaller: its matrices
// are packed tighter in the same space). The weight gradient's GEMMs are batched [16 x splits] over [rows / splits]
// pieces.
// The GEMMs sum over channels in cuBLASLt's order, so results differ from the direct kernels' by rounding (a few
// units in the last place relative to the largest output; the tests' f32 tolerance is 2e-5).
// Measured (H100, 2026-12-06, before the weight gradient's pieces): Darknet's 128 -> 256 3x3 at 152^2 x 8 57.9 / 60.2
// / 56.2 TFLOP/s-equivalent forward / data / weight against the direct SIMT kernel's 43.3 / 36.3 / 42.1; ResNet's
// 64 -> 64 at 128^2 31.8 / 32.8 / 7.4 against 30.4 / 31.1 / 15.5 (the weight gradient's 16 GEMMs of [64, 64]
// outputs filled 16 blocks: hence the pieces; with them 32.6, and 256 -> 256 dilated 58.9 -> 73.8). With chunks cut
// inside an image (H200, 2026-12-06, step 6, fp32): pix2pixHD at 2048 x 1024 346.7 ms against the direct kernels'
// 456.6, StyleGAN 1024^2 x 4 198.4 against 269.3. Bound: the GEMMs (cuBLASLt's SIMT SGEMM) and the transforms' memory.
#include "engine/cuda/runtime.h"
#include "ops/cuda/conv_kernels.cuh"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/matmul.h"

namespace ops::cuda::conv {

using engine::Tensor;

namespace {

constexpr int kThreads = 256;

// One pass's tiling: the tensor the input transform reads ([images, in_h, in_w, in_c]; x, or dy for the data
// gradient) and the output grid the tiles cover ([images, out_h, out_w]).
struct Grid {
  int in_h, in_w, in_c;
  int out_h, out_w;
  int pad_h, pad_w, dil_h, dil_w;
  int tiles_h, tiles_w;
};

// Tile t's image and first output position.
__device__ __forceinline__ void tile_origin(const Grid& g, int64_t t, int& img, int& oh, int& ow) {
  const int b = int(t % g.tiles_w), a = int(t / g.tiles_w % g.tiles_h);
  img = int(t / (int64_t(g.tiles_w) * g.tiles_h));
  oh = a % g.dil_h + 2 * g.dil_h * (a / g.dil_h);
  ow = b % g.dil_w + 2 * g.dil_w * (b / g.dil_w);
}

__device__ __forceinline__ float4 operator+(float4 a, float4 b) { return {a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w}; }
__device__ __forceinline__ float4 operator-(float4 a, float4 b) { return {a.x - b.x, a.y - b.y, a.z - b.z, a.w - b.w}; }
__device__ __forceinline__ float4 half(float4 a) { return {0.5f * a.x, 0.5f * a.y, 0.5f * a.z, 0.5f * a.w}; }
__device__ __forceinline__ float4 neg(float4 a) { return {-a.x, -a.y, -a.z, -a.w}; }

// B^T v, A^T v, G v, A v, G^T v along one axis (4 -> 4, 4 -> 2, 3 -> 4, 2 -> 4, 4 -> 3).
struct BT {
  static constexpr int kIn = 4, kOut = 4;
  __device__ static void apply(const float4* v, float4* o) {
    o[0] = v[0] - v[2], o[1] = v[1] + v[2], o[2] = v[2] - v[1], o[3] = v[1] - v[3];
  }
};
struct AT {
  static constexpr int kIn = 4, kOut = 2;
  __device__ static void apply(const float4* v, float4* o) { o[0] = v[0] + v[1] + v[2], o[1] = v[1] - v[2] - v[3]; }
};
struct Gm {
  static constexpr int kIn = 3, kOut = 4;
  __device__ static void apply(const float4* v, float4* o) {
    const float4 s = half(v[0] + v[2]), h = half(v[1]);
    o[0] = v[0], o[1] = s + h, o[2] = s - h, o[3] = v[2];
  }
};
struct Am {
  static constexpr int kIn = 2, kOut = 4;
  __device__ static void apply(const float4* v, float4* o) {
    o[0] = v[0], o[1] = v[0] + v[1], o[2] = v[0] - v[1], o[3] = neg(v[1]);
  }
};
struct GT {
  static constexpr int kIn = 4, kOut = 3;
  __device__ static void apply(const float4* v, float4* o) {
    const float4 s = half(v[1] + v[2]);
    o[0] = v[0] + s, o[1] = half(v[1] - v[2]), o[2] = s + v[3];
  }
};

// out = T in T^T for a kIn x kIn block (rows, then columns).
template <typename T>
__device__ __forceinline__ void transform2d(const float4 (&in)[T::kIn][T::kIn], float4 (&out)[T::kOut][T::kOut]) {
  float4 rows[T::kOut][T::kIn];
#pragma unroll
  for (int c = 0; c < T::kIn; c++) {
    float4 col[T::kIn], res[T::kOut];
#pragma unroll
    for (int r = 0; r < T::kIn; r++) col[r] = in[r][c];
    T::apply(col, res);
#pragma unroll
    for (int r = 0; r < T::kOut; r++) rows[r][c] = res[r];
  }
#pragma unroll
  for (int r = 0; r < T::kOut; r++) T::apply(rows[r], out[r]);
}

__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

// A [16, rows, cols] array's 16 positions of row `row`, columns c .. c + 3, as a 4x4 block.
__device__ __forceinline__ void load16(const float* a, int64_t rows, int64_t row, int cols, int c, float4 (&v)[4][4]) {
#pragma unroll
  for (int p = 0; p < 16; p++) v[p / 4][p % 4] = load4(a + (p * rows + row) * cols + c);
}
__device__ __forceinline__ void store16(float* a, int64_t rows, int64_t row, int cols, int c, const float4 (&v)[4][4]) {
#pragma unroll
  for (int p = 0; p < 16; p++) store4(a + (p * rows + row) * cols + c, v[p / 4][p % 4]);
}

// The tile kernels' thread: row `tile` of a chunk of `tiles` tiles from tile `first` of the batch (its image and first
// output position) and channels c .. c + 3 of `channels`; false past the chunk's last.
struct TileThread {
  int64_t tile;
  int c, img, oh, ow;
};
__device__ __forceinline__ bool tile_thread(const Grid& g, int64_t first, int64_t tiles, int channels, TileThread& th) {
  const int vecs = channels / 4;
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= tiles * vecs) return false;
  th.tile = i / vecs, th.c = int(i % vecs) * 4;
  tile_origin(g, first + th.tile, th.img, th.oh, th.ow);
  return true;
}
// Output position (h, w) of image img in [images, out_h, out_w, .]: its pixel index, or -1 past the output.
__device__ __forceinline__ int64_t out_pixel(const Grid& g, int img, int h, int w) {
  return h < g.out_h && w < g.out_w ? (int64_t(img) * g.out_h + h) * g.out_w + w : -1;
}
// The filter kernels' thread: output channel co, input channels ci .. ci + 3; false past the last.
__device__ __forceinline__ bool filter_thread(int cout, int cin, int& co, int& ci) {
  const int vecs = cin / 4;
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= int64_t(cout) * vecs) return false;
  co = int(i / vecs), ci = int(i % vecs) * 4;
  return true;
}

// V[p][t][c] = (B^T d B)[p] of the chunk's tile t's 4x4 patch of `in` [images, in_h, in_w, in_c], channels c .. c + 3,
// V [16, rows, in_c]. Bound: memory.
__global__ void __launch_bounds__(kThreads) input_transform(const float* __restrict__ in, Grid g, int64_t first,
                                                            int64_t tiles, int64_t rows, float* __restrict__ v) {
  TileThread th;
  if (!tile_thread(g, first, tiles, g.in_c, th)) return;
  float4 d[4][4];
#pragma unroll
  for (int e = 0; e < 4; e++) {
    const int h = th.oh - g.pad_h + g.dil_h * e;
#pragma unroll
    for (int f = 0; f < 4; f++) {
      const int w = th.ow - g.pad_w + g.dil_w * f;
      const bool ok = unsigned(h) < unsigned(g.in_h) && unsigned(w) < unsigned(g.in_w);
      d[e][f] = ok ? load4(in + ((int64_t(th.img) * g.in_h + h) * g.in_w + w) * g.in_c + th.c) : float4{0, 0, 0, 0};
    }
  }
  float4 o[4][4];
  transform2d<BT>(d, o);
  store16(v, rows, th.tile, g.in_c, th.c, o);
}

// U[p][co][ci] = (G g G^T)[p] of filter (co, ci) of w [Cout, 3, 3, Cin], turned by 180 degrees with `turn`.
__global__ void __launch_bounds__(kThreads)
    filter_transform(const float* __restrict__ w, int cout, int cin, bool turn, float* __restrict__ u) {
  int co, ci;
  if (!filter_thread(cout, cin, co, ci)) return;
  float4 k[3][3];
#pragma unroll
  for (int r = 0; r < 3; r++)
#pragma unroll
    for (int s = 0; s < 3; s++) {
      const int tap = turn ? (2 - r) * 3 + (2 - s) : r * 3 + s;
      k[r][s] = load4(w + (int64_t(co) * 9 + tap) * cin + ci);
    }
  float4 o[4][4];
  transform2d<Gm>(k, o);
  store16(u, cout, co, cin, ci, o);
}

// y at the chunk's tile t's (up to) 2x2 outputs = (A^T M A) + bias, channels c .. c + 3; y is [images, out_h, out_w,
// cols].
__global__ void __launch_bounds__(kThreads)
    output_transform(const float* __restrict__ m, Grid g, int64_t first, int64_t tiles, int cols,
                     const float* __restrict__ bias, float* __restrict__ y) {
  TileThread th;
  if (!tile_thread(g, first, tiles, cols, th)) return;
  float4 in[4][4], o[2][2];
  load16(m, tiles, th.tile, cols, th.c, in);
  transform2d<AT>(in, o);
  const float4 b = bias ? load4(bias + th.c) : float4{0, 0, 0, 0};
#pragma unroll
  for (int e = 0; e < 2; e++)
#pragma unroll
    for (int f = 0; f < 2; f++) {
      const int64_t px = out_pixel(g, th.img, th.oh + g.dil_h * e, th.ow + g.dil_w * f);
      if (px >= 0) store4(y + px * cols + th.c, o[e][f] + b);
    }
}

// Y[p][t][c] = (A dY A^T)[p] of the chunk's tile t's 2x2 block of dy [images, out_h, out_w, cols] (zeros past the
// output), Y [16, rows, cols].
__global__ void __launch_bounds__(kThreads)
    grad_transform(const float* __restrict__ dy, Grid g, int64_t first, int64_t tiles, int64_t rows, int cols,
                   float* __restrict__ out) {
  TileThread th;
  if (!tile_thread(g, first, tiles, cols, th)) return;
  float4 d[2][2], o[4][4];
#pragma unroll
  for (int e = 0; e < 2; e++)
#pragma unroll
    for (int f = 0; f < 2; f++) {
      const int64_t px = out_pixel(g, th.img, th.oh + g.dil_h * e, th.ow + g.dil_w * f);
      d[e][f] = px >= 0 ? load4(dy + px * cols + th.c) : float4{0, 0, 0, 0};
    }
  transform2d<Am>(d, o);
  store16(out, rows, th.tile, cols, th.c, o);
}

// dw[co][r][s][ci] = (G^T dU G)[r][s], dU the sum of the pieces' dU [16, splits, Cout, Cin] in order of the piece.
__global__ void __launch_bounds__(kThreads)
    weight_output(const float* __restrict__ du, int cout, int cin, int splits, float* __restrict__ dw) {
  int co, ci;
  if (!filter_thread(cout, cin, co, ci)) return;
  float4 in[4][4], o[3][3];
  load16(du, int64_t(splits) * cout, co, cin, ci, in);  // piece 0: rows co of [16, splits * Cout, Cin]
  for (int s = 1; s < splits; s++) {
    float4 piece[4][4];
    load16(du, int64_t(splits) * cout, int64_t(s) * cout + co, cin, ci, piece);
#pragma unroll
    for (int p = 0; p < 16; p++) in[p / 4][p % 4] = in[p / 4][p % 4] + piece[p / 4][p % 4];
  }
  transform2d<GT>(in, o);
#pragma unroll
  for (int r = 0; r < 3; r++)
#pragma unroll
    for (int s = 0; s < 3; s++) store4(dw + (int64_t(co) * 9 + r * 3 + s) * cin + ci, o[r][s]);
}

unsigned blocks_for(int64_t threads) { return unsigned((threads + kThreads - 1) / kThreads); }

// The pass's grid over an output of out_h x out_w read from an input of in_h x in_w x in_c.
Grid grid_of(const ConvGeometry& g, int in_h, int in_w, int in_c, int out_h, int out_w, int pad_h, int pad_w) {
  const int dh = int(g.p.dilation_h), dw = int(g.p.dilation_w);
  return Grid{in_h,
              in_w,
              in_c,
              out_h,
              out_w,
              pad_h,
              pad_w,
              dh,
              dw,
              int(winograd_tiles(out_h, dh)),
              int(winograd_tiles(out_w, dw))};
}

// [16, rows, cols] contiguous at element `at` of ws.
Tensor batch16(const Tensor& ws, int64_t at, int64_t rows, int64_t cols) {
  return Tensor::view_of(ws, {16, rows, cols}, {rows * cols, cols, 1}, ws.offset() + at);
}

// The pass's plan; its chunk as many tiles as the workspace holds when that is less than the plan's (the op allocates
// conv2d_winograd's workspace; tests pass smaller ones to cut the batch, and its images, into more chunks).
WinogradPlan checked_plan(const ConvGeometry& g, ConvPass pass, const Tensor& ws) {
  WinogradPlan plan = conv2d_winograd(g, pass, 4, false);
  ENGINE_CHECK(plan.chunk > 0, "conv2d: Winograd's F(2x2, 3x3) does not apply to this geometry (conv_params.h's ",
               "conv2d_winograd)");
  const int64_t least = winograd_elems(g, plan, 1);
  ENGINE_CHECK(ws.dtype() == engine::DType::f32 && ws.is_contiguous() && ws.numel() >= least,
               "conv2d (Winograd): the workspace must be f32, contiguous, with at least ", least,
               " elements for this geometry (", plan.elems, " as the op allocates it), got ",
               engine::dtype_name(ws.dtype()), " ", engine::shape_str(ws.shape()));
  if (ws.numel() < plan.elems)  // the rows it holds, a multiple of the pieces
    plan.chunk = (ws.numel() - winograd_elems(g, plan, 0)) / (16 * (g.cin + g.cout)) / plan.splits * plan.splits;
  return plan;
}

// Forward and data gradient alike: out = conv of `in` (the grid's input) with filters U already in ws, in chunks of
// the plan's tiles.
void tiled_forward(const Tensor& in, const Tensor& out, const Grid& gr, int64_t images, const WinogradPlan& plan,
                   int out_c, const Tensor& u_as_b, const float* bias, const Tensor& ws, int64_t at) {
  cudaStream_t s = engine::cuda::stream();
  const int64_t all = images * plan.tiles;
  for (int64_t first = 0; first < all; first += plan.chunk) {
    const int64_t tiles = std::min(plan.chunk, all - first);
    const Tensor v = batch16(ws, at, tiles, gr.in_c), m = batch16(ws, at + 16 * tiles * gr.in_c, tiles, out_c);
    input_transform<<<blocks_for(tiles * gr.in_c / 4), kThreads, 0, s>>>(in.data<float>(), gr, first, tiles, tiles,
                                                                         v.data<float>());
    ENGINE_CUDA_LAUNCH_CHECK("conv2d (Winograd input transform)");
    matmul(v, u_as_b, Tensor(), m);
    output_transform<<<blocks_for(tiles * out_c / 4), kThreads, 0, s>>>(m.data<float>(), gr, first, tiles, out_c, bias,
                                                                        out.data<float>());
    ENGINE_CUDA_LAUNCH_CHECK("conv2d (Winograd output transform)");
  }
}

}  // namespace

void winograd_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const ConvGeometry& g,
                      const Tensor& ws) {
  const WinogradPlan plan = checked_plan(g, ConvPass::forward, ws);
  const int cin = int(g.cin), cout = int(g.cout);
  const Tensor u = batch16(ws, 0, cout, cin);  // [16, Cout, Cin]; the GEMM's B is its transpose
  filter_transform<<<blocks_for(int64_t(cout) * cin / 4), kThreads, 0, engine::cuda::stream()>>>(
      w.data<float>(), cout, cin, false, u.data<float>());
  ENGINE_CUDA_LAUNCH_CHECK("conv2d (Winograd filter transform)");
  const Tensor ut = Tensor::view_of(ws, {16, cin, cout}, {int64_t(cout) * cin, 1, cin}, ws.offset());
  const Grid gr = grid_of(g, int(g.h), int(g.w), cin, int(g.ho), int(g.wo), int(g.p.pad_h), int(g.p.pad_w));
  tiled_forward(x, y, gr, g.n, plan, cout, ut, bias.defined() ? bias.data<float>() : nullptr, ws,
                16 * int64_t(cout) * cin);
}

void winograd_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const ConvGeometry& g, const Tensor& ws) {
  const WinogradPlan plan = checked_plan(g, ConvPass::data, ws);
  const int cin = int(g.cin), cout = int(g.cout);
  const Tensor u = batch16(ws, 0, cout, cin);  // [16, Cout, Cin] of the turned filters: the GEMM's [K, N]
  filter_transform<<<blocks_for(int64_t(cout) * cin / 4), kThreads, 0, engine::cuda::stream()>>>(
      w.data<float>(), cout, cin, true, u.data<float>());
  ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_data (Winograd filter transform)");
  const int pad_h = int(2 * g.p.dilation_h - g.p.pad_h), pad_w = int(2 * g.p.dilation_w - g.p.pad_w);
  const Grid gr = grid_of(g, int(g.ho), int(g.wo), cout, int(g.h), int(g.w), pad_h, pad_w);
  tiled_forward(dy, dx, gr, g.n, plan, cin, u, nullptr, ws, 16 * int64_t(cout) * cin);
}

void winograd_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const ConvGeometry& g, const Tensor& ws) {
  const WinogradPlan plan = checked_plan(g, ConvPass::weight, ws);
  const int cin = int(g.cin), cout = int(g.cout), splits = int(plan.splits);
  cudaStream_t s = engine::cuda::stream();
  // The pieces' partial dU [16, splits, Cout, Cin]: batch entry p * splits + piece of the GEMMs below.
  const Tensor du = Tensor::view_of(ws, {16 * int64_t(splits), cout, cin}, {int64_t(cout) * cin, cin, 1}, ws.offset());
  const Grid gr = grid_of(g, int(g.h), int(g.w), cin, int(g.ho), int(g.wo), int(g.p.pad_h), int(g.p.pad_w));
  const int64_t all = g.n * plan.tiles, at = du.numel();
  for (int64_t first = 0; first < all; first += plan.chunk) {
    const int64_t tiles = std::min(plan.chunk, all - first);
    const int64_t rows = winograd_rows(tiles, splits), piece = rows / splits;
    const Tensor v = batch16(ws, at, rows, cin), yt = batch16(ws, at + 16 * rows * cin, rows, cout);
    if (rows > tiles) {  // the last piece's rows past the tiles: zeros in both operands (a product of finite zeros)
      for (const Tensor* m : {&v, &yt}) {
        const size_t row_bytes = size_t(m->size(2)) * sizeof(float);
        ENGINE_CUDA_CHECK(cudaMemset2DAsync(m->data<float>() + tiles * m->size(2), rows * row_bytes, 0,
                                            (rows - tiles) * row_bytes, 16, s));
      }
    }
    input_transform<<<blocks_for(tiles * cin / 4), kThreads, 0, s>>>(x.data<float>(), gr, first, tiles, rows,
                                                                     v.data<float>());
    ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_weight (Winograd input transform)");
    grad_transform<<<blocks_for(tiles * cout / 4), kThreads, 0, s>>>(dy.data<float>(), gr, first, tiles, rows, cout,
                                                                     yt.data<float>());
    ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_weight (Winograd gradient transform)");
    // dU[p][k] (+)= Y[p][k]^T V[p][k] over piece k of the rows: [Cout, piece] x [piece, Cin], 16 x splits of them.
    const int64_t b = 16 * int64_t(splits);
    const Tensor yt_t = Tensor::view_of(ws, {b, cout, piece}, {piece * cout, 1, cout}, yt.offset());
    const Tensor vp = Tensor::view_of(ws, {b, piece, cin}, {piece * cin, cin, 1}, v.offset());
    if (first == 0)
      matmul(yt_t, vp, Tensor(), du);
    else
      matmul_accumulate(yt_t, vp, du);
  }
  weight_output<<<blocks_for(int64_t(cout) * cin / 4), kThreads, 0, s>>>(du.data<float>(), cout, cin, splits,
                                                                         dw.data<float>());
  ENGINE_CUDA_LAUNCH_CHECK("conv2d_backward_weight (Winograd weight transform)");
}

}  // namespace ops::cuda::conv
