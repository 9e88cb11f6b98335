// conv_params.h: the geometry of a 2-D convolution, shared by the op (ops/conv.cpp), its cpu reference
// kernels (ops/cpu/conv.*) and its CUDA kernels (ops/cuda/conv*), so that all three agree on shapes and on
// the workspace the op allocates for the GPU's weight gradient.
//
// Layouts (the engine is channels-last): x [N, H, W, Cin], weight [Cout, KH, KW, Cin / groups] (KRSC, the
// implicit-GEMM layout: the reduction dimension (kh, kw, c) is contiguous in c), y [N, Ho, Wo, Cout], all
// contiguous. PyTorch's weights ([Cout, Cin / groups, KH, KW]) are permuted when a model loads them.
//   Ho = (H + 2 pad_h - dilation_h (KH - 1) - 1) / stride_h + 1   (and the same for W)
// A transposed convolution is the data gradient of a convolution (its forward is conv2d_backward_data with
// the roles of x and y exchanged), so the three kernels below serve both.
#pragma once
#include <algorithm>
#include <cstdint>

#include "engine/env.h"

namespace ops {

struct Conv2dParams {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
};

// The three kernels of a convolution: y from x (forward), dx from dy (data gradient), dw from x and dy (weight).
enum class ConvPass { forward, data, weight };

// Every size a kernel needs, computed once from the operands' shapes.
struct ConvGeometry {
  int64_t n = 0, h = 0, w = 0, cin = 0;  // input  [N, H, W, Cin]
  int64_t cout = 0, kh = 0, kw = 0;      // weight [Cout, KH, KW, Cin / groups]
  int64_t ho = 0, wo = 0;                // output [N, Ho, Wo, Cout]
  Conv2dParams p;
  int64_t cin_per_group() const { return cin / p.groups; }
  int64_t cout_per_group() const { return cout / p.groups; }
  // The implicit GEMM's sizes: M = output pixels, N = output channels (per group), K = kh * kw * cin/group.
  int64_t gemm_m() const { return n * ho * wo; }
  int64_t gemm_k() const { return kh * kw * cin_per_group(); }
  // One filter per channel (groups == Cin == Cout): no reduction over channels (cuda/conv_depthwise.cu).
  bool depthwise() const { return p.groups > 1 && p.groups == cin && p.groups == cout; }
  // 1x1, stride 1, no padding, one group: a plain GEMM over the NHWC matrices (cuBLASLt on the GPU).
  bool pointwise() const {
    return kh == 1 && kw == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 0 && p.pad_w == 0 && p.groups == 1;
  }
};

// The geometry the GPU computes for a convolution with elements of `elem_bytes`: g itself, or g with its channel
// counts rounded up to the tensor-core and SIMT kernels' channel vector (8 16-bit or 4 f32 elements), for one
// group and not a 1x1 GEMM (cuBLASLt takes any count):
// - Cin, for a spatial filter (its taps amortize the copy of x) when the zeros add at most a quarter to the
//   reduction: pix2pixHD's discriminators take 39 channels (image and label map; their first 4x4 convolutions were
//   850 of a 1340 ms fp32 step on the generic kernel) and its local enhancer 36; not 1x1 convolutions. The
//   16-bit tensor-core kernels gather narrower inputs (the 3-channel stems) element by element, but the f32 SIMT
//   kernels have no such variant, so in f32 every Cin is padded (under TF32 too, whose kernels could gather: the
//   copy is memory the meta device accounts, and the choice depends on the element size alone): YOLOv3's 3 -> 32
//   stem at 608^2 took 63 ms of a 204 ms fp32 step on the generic kernel (its weight gradient, 0.08 TFLOP/s);
// - Cout, always for 16-bit types and for f32 once Cin (padded) is a multiple of 4: the image generators' final
//   3-channel layers (pix2pixHD's 7x7 32 -> 3 at 2048 x 1024 took 82 ms of a 190 ms bf16 step on the generic
//   kernel).
// When it differs from g the op allocates, on every device (meta predicts it; the cpu leaves it unused), the
// workspace of conv2d_padding_elems; the GPU copies the operands in with zeros in the padded channels (zero
// filters, zero input channels), runs the padded convolution and copies the real channels out.
inline ConvGeometry conv2d_padded(const ConvGeometry& g, int64_t elem_bytes) {
  const int64_t vec = elem_bytes == 2 ? 8 : elem_bytes == 4 ? 4 : 1;
  ConvGeometry p = g;
  if (vec == 1 || g.p.groups != 1 || g.pointwise()) return p;
  auto up = [vec](int64_t c) { return (c + vec - 1) / vec * vec; };
  if (g.kh * g.kw > 1 && g.cin % vec != 0 && (4 * up(g.cin) <= 5 * g.cin || elem_bytes == 4)) p.cin = up(g.cin);
  if (g.cout % vec != 0 && (elem_bytes == 2 || p.cin % 4 == 0)) p.cout = up(g.cout);
  return p;
}
// The padding workspace's elements (0 when none), in x's dtype: the padded weight [Cout', KH, KW, Cin'] and bias
// [Cout'], then the padded input (x, or dx in the data gradient) [N, H, W, Cin'] when Cin' > Cin, then the padded
// output (y, or dy in the gradients) [N, Ho, Wo, Cout'] when Cout' > Cout.
inline int64_t conv2d_padding_elems(const ConvGeometry& g, int64_t elem_bytes) {
  const ConvGeometry p = conv2d_padded(g, elem_bytes);
  if (p.cin == g.cin && p.cout == g.cout) return 0;
  int64_t elems = p.cout * (p.gemm_k() + 1);
  if (p.cin != g.cin) elems += g.n * g.h * g.w * p.cin;
  if (p.cout != g.cout) elems += p.gemm_m() * p.cout;
  return elems;
}

// The depthwise weight gradient's filter rows per GPU thread (cuda/conv_depthwise.cu says why): all K for 3x3 and
// 5x5, one for 7x7. Its grid has K / rows blocks per block of channels and split.
constexpr int depthwise_weight_rows(int64_t k) { return k == 7 ? 1 : int(k); }

// How many pieces the weight gradient's reduction over the N * Ho * Wo output pixels is cut into on the
// GPU. When it is more than 1 the op allocates an f32 workspace [splits, Cout, KH, KW, Cin / groups] (on
// every device, so meta predicts it) into which each piece writes its partial sum; a second pass adds
// them in a fixed order (deterministic, no atomics). A function of the shape alone: early ResNet layers
// (few weight tiles, millions of pixels) need splits to fill the GPU's 132 SMs; late ones do not. Tiles
// are the GPU kernel's (ops/cuda/conv_igemm_weight.cu): 128 x 128 of dw [Cout/g, KH*KW*Cin/g].
inline int64_t conv2d_weight_grad_splits(const ConvGeometry& g) {
  if (g.depthwise()) {
    // Depthwise (cuda/conv_depthwise.cu): per split a block per about 64 channels and depthwise_weight_rows
    // filter rows, about four blocks per multiprocessor in all, each split >= 256 output pixels, the f32
    // workspace at most 8 MiB.
    const int64_t blocks = (g.cout + 63) / 64 * (g.kh / depthwise_weight_rows(g.kh));
    const int64_t wanted = (528 + blocks - 1) / blocks;
    const int64_t most = std::max<int64_t>(1, g.gemm_m() / 256);
    const int64_t room = std::max<int64_t>(1, (int64_t(8) << 20) / (4 * g.cout * g.kh * g.kw));
    return std::max<int64_t>(1, std::min<int64_t>({wanted, most, room, 256}));
  }
  if (g.pointwise()) return 1;  // the GPU runs a 1x1 convolution as one cuBLASLt GEMM (ops/cuda/conv.cu): no pieces
  // At most two waves of tiles (264: the workspace stays within 264 tiles of 128 x 128 f32, 17 MiB), each piece
  // reducing >= 1024 pixels, at most 256 pieces; among those, the most pieces whose time in waves, ceil(tiles *
  // splits / 132) / splits of one piece's, is within 5% of the least. Waves, because blocks of equal work finish
  // together: 18 tiles in 15 pieces (270 blocks) took three waves of 132 where 14 pieces (252) take two, and the third
  // held 6 blocks. The most pieces near the least time, because a layer of one or two tiles (the 3-channel stems: dw
  // [32, 27] or [64, 147]) runs latency-bound gathering copies that want more than one block per SM (64 pieces left
  // half the SMs idle and ran the Darknet stem's gradient at 2 TFLOP/s): it takes 256, not 132.
  const int64_t tiles = g.p.groups * ((g.cout_per_group() + 127) / 128) * ((g.gemm_k() + 127) / 128);
  const int64_t most = std::min<int64_t>({std::max<int64_t>(1, 264 / tiles), g.gemm_m() / 1024, 256});
  auto waves_per_piece = [&](int64_t s) { return double((tiles * s + 131) / 132) / double(s); };
  double least = waves_per_piece(1);
  for (int64_t s = 2; s <= most; s++) least = std::min(least, waves_per_piece(s));
  int64_t splits = 1;
  for (int64_t s = 2; s <= most; s++)
    if (waves_per_piece(s) <= 1.05 * least) splits = s;
  return splits;
}

// Winograd's minimal filtering F(2x2, 3x3) (Lavin and Gray, 2015) for the GPU's true-fp32 3x3 convolutions: each
// 2x2 block of outputs (a tile) takes 16 products per (input, output) channel pair instead of 36. The GPU transforms
// 4x4 input patches (V = B^T d B), the filters (U = G g G^T) or the output gradient's tiles (A dY A^T), multiplies
// 16 GEMMs (one per position of the 4x4 transform, over the channels) on cuBLASLt in true fp32, and transforms back
// (ops/cuda/conv_winograd.cu). The data gradient is the forward convolution of dy with the filters turned by 180
// degrees (padding 2 d - p); the weight gradient is sum over tiles of (A dY A^T) . V, taken back by G^T dU G.
// Dilation d runs as d x d interleaved grids (a tile is 2 outputs d apart in each direction, its patch 4 inputs d
// apart).
// When: f32 without TF32 (TF32's tensor-core kernels are faster), one group, 3x3, stride 1, padding <= 2 d (the data
// gradient's padding 2 d - p is not negative), both channel counts multiples of 4 (the transforms move float4s;
// conv2d_padded makes them so in f32) and >= 64: the transforms move ~36 (Cin + Cout)
// bytes per output pixel, so narrower layers are memory-bound and the direct SIMT kernel (conv_simt.cu) is faster.
// The weight gradient's 16 GEMMs have small outputs ([Cout, Cin]) and long sums (the tiles): alone they would fill 16
// blocks of the GPU's 132 SMs at 64 channels (measured on an H100: 7.4 TFLOP/s-equivalent, half the direct kernel's
// 15.5), so each chunk's tiles are cut into `splits` pieces, as the direct weight gradient's pixels are
// (conv2d_weight_grad_splits): 16 x splits GEMMs write partial dU's that the last transform adds in a fixed order
// (deterministic). Pieces: enough for two waves of 128 x 128 output tiles, at most 32, each >= 1024 tiles.
// The workspace (f32, allocated by the op on every device, so meta predicts it; the cpu leaves it unused) holds the
// transformed filters [16, Cout, Cin] (the weight gradient: its partial sums [16 splits, Cout, Cin]) and, for a chunk
// of tiles, the transformed input [16, rows, channels in] and the products [16, rows, channels out], rows = the
// chunk's tiles rounded up to a multiple of the pieces (zeros past the tiles). A chunk is a range of the batch's tiles
// (numbered image by image) sized so that the workspace stays under kWinogradBytes: whole images, as many as fit, in
// chunks of equal size, or, where one image's tiles alone exceed the budget, equal parts of an image's tiles (the
// kernels find each tile's image, so a chunk may straddle two). pix2pixHD's and its VGG loss's 64-channel layers at
// 2048 x 1024 (4 GiB of tiles an image) run in 17 parts of ~250 MiB. Layers whose filters alone nearly fill the
// budget (a chunk under kWinogradLeastTiles) take the direct kernels. On by default (measured faster on an H100,
// BENCHMARKS.md 2026-12-06); ENGINE_CONV_WINOGRAD=0 in the environment turns it off on every device (the direct
// kernels, no workspace), for measuring.
constexpr int64_t kWinogradBytes = int64_t(256) << 20;
constexpr int64_t kWinogradLeastTiles = 1024;

// 2x2 tiles along one axis of an output of `out` positions with dilation d: each of the d interleaved grids in pairs.
inline int64_t winograd_tiles(int64_t out, int64_t d) { return d * (((out + d - 1) / d + 1) / 2); }

struct WinogradPlan {
  int64_t tiles = 0;   // per image (tiles_h * tiles_w of the pass's output grid)
  int64_t chunk = 0;   // tiles per chunk (the last may have fewer); 0: the pass does not use Winograd
  int64_t splits = 1;  // pieces of a chunk's tiles (the weight gradient; 1 for the other passes)
  int64_t elems = 0;   // the workspace's f32 elements
};

// A chunk's rows: its tiles rounded up to a multiple of the pieces.
inline int64_t winograd_rows(int64_t tiles, int64_t splits) { return (tiles + splits - 1) / splits * splits; }

// The f32 elements of a workspace for chunks of `chunk` tiles of geometry g with the plan's pieces.
inline int64_t winograd_elems(const ConvGeometry& g, const WinogradPlan& plan, int64_t chunk) {
  return 16 * plan.splits * g.cin * g.cout + 16 * (g.cin + g.cout) * winograd_rows(chunk, plan.splits);
}

// The pass's plan for a convolution of `elem_bytes` elements (the geometry the GPU computes: conv2d_padded's),
// with TF32 allowed or not (engine::allow_tf32()).
inline WinogradPlan conv2d_winograd(const ConvGeometry& g, ConvPass pass, int64_t elem_bytes, bool tf32) {
  WinogradPlan plan;
  const auto& p = g.p;
  if (elem_bytes != 4 || tf32 || p.groups != 1 || g.kh != 3 || g.kw != 3 || p.stride_h != 1 || p.stride_w != 1 ||
      p.pad_h > 2 * p.dilation_h || p.pad_w > 2 * p.dilation_w || g.cin < 64 || g.cout < 64 || g.cin % 4 != 0 ||
      g.cout % 4 != 0 || g.n == 0 ||
      !engine::env_switch("ENGINE_CONV_WINOGRAD", true, "the direct SIMT kernels", "Winograd's F(2x2, 3x3)"))
    return plan;
  const bool data = pass == ConvPass::data;  // tiles over dx's grid
  plan.tiles = winograd_tiles(data ? g.h : g.ho, p.dilation_h) * winograd_tiles(data ? g.w : g.wo, p.dilation_w);
  auto pieces = [&](int64_t tiles) {  // the weight gradient's pieces for a chunk of `tiles` tiles
    if (pass != ConvPass::weight) return int64_t(1);
    const int64_t blocks = 16 * ((g.cout + 127) / 128) * ((g.cin + 127) / 128);
    return std::max<int64_t>(1, std::min<int64_t>({(264 + blocks - 1) / blocks, 32, tiles / 1024}));
  };
  const int64_t all = g.n * plan.tiles, per_tile = 16 * (g.cin + g.cout);
  plan.splits = pieces(all);
  const int64_t room = (kWinogradBytes / 4 - winograd_elems(g, plan, 0) - per_tile * (plan.splits - 1)) / per_tile;
  if (room >= plan.tiles) {  // whole images
    const int64_t chunks = (g.n + room / plan.tiles - 1) / (room / plan.tiles);
    plan.chunk = (g.n + chunks - 1) / chunks * plan.tiles;
  } else {  // equal parts of one image's tiles
    if (room < kWinogradLeastTiles) return WinogradPlan{};
    const int64_t parts = (plan.tiles + room - 1) / room;
    plan.chunk = (plan.tiles + parts - 1) / parts;
  }
  plan.splits = std::min(plan.splits, pieces(plan.chunk));  // fewer when the chunk is smaller
  plan.elems = winograd_elems(g, plan, plan.chunk);
  return plan;
}

}  // namespace ops
