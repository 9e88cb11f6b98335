// gpu_profiles.cpp: the table of GPU profiles and where each number comes from.
//
// Memory (memory_mib)
// -------------------
// The total that nvidia-smi prints on a recent driver (R510 and later list the driver's own share as a
// separate "Reserved" line under FB Memory Usage and print the whole framebuffer as Total). For GDDR
// cards without ECC that is the vendor's size in binary units: 11 GB = 11264 MiB. Older drivers printed
// less (the 2020 study's drivers: e.g. an A100 40GB read 40536 MiB on R470, 40960 MiB on R580).
// Cards with ECC on by default lose 1/16 of GDDR to it and report that: T4 16384 * 15/16 = 15360 MiB,
// L4 24576 * 15/16 = 23040 (23034 reported).
// Seen reported (nvidia-smi "Memory-Usage" total):
//   GTX 1080 Ti 11264 MiB (driver 531.14; PromtEngineer/localGPT issue #14)
//   A100-SXM4-40GB 40960 MiB (driver 580.126; bottlerocket-os/bottlerocket-core-kit PR #834)
//   H100 81559, A100 80GB 81920, A100 40GB 40960, L4 23034, T4 15360 MiB (modal-labs/modal-client PR #2797)
//   H200 143771 MiB, Reserved 616 MiB (driver 580.159; measured on this project's H200 machine)
//   RTX 4090 24564 MiB (driver 550.163; RLinf/RLinf issue #255), RTX 3090 24576 MiB (driver 595.84;
//   noonghunna/club-3090 issue #1128)
// The others are the vendor's GB x 1024 (GDDR cards without ECC on, as the 1080 Ti above).
//
// Reserve (reserve_mib): ESTIMATES
// --------------------------------
// What a training process cannot give its arena: (a) memory the driver keeps (cudaMemGetInfo's total is
// below nvidia-smi's), (b) the CUDA context (per-SM local memory, loaded kernel images), (c) the GEMM
// library's handles and kernels (cuBLASLt; the engine uses no cuDNN). Figures that were seen:
//   Hopper   measured on the H200 (driver 580, CUDA 13, lazy module loading): driver reserve 616 MiB
//            (cudaMemGetInfo total 143156 of 143771); a bare cudart context 527 MiB; PyTorch 2.11 with
//            cuBLAS and cuDNN loaded 703 MiB (with CUDA_MODULE_LOADING=EAGER, the pre-11.7 behaviour:
//            2033 MiB). Estimate 616 + ~700 = 1320 MiB.
//   Ampere   A100 40GB: deviceQuery's total 40339 MiB vs nvidia-smi's 40960 (driver reserve ~620 MiB,
//            bottlerocket-os/bottlerocket PR #3873); a lazily loaded context ~300 MB (PyTorch maintainer,
//            pytorch/pytorch issue #107667). Estimate 620 + ~400 = 1000 MiB. GeForce Ampere/Ada and L4:
//            an RTX 3090 read 24268 of 24576 MiB on driver 455 (~310 MiB driver share, pytorch/pytorch
//            issue #54564). Estimate 310 + ~400 = 700 MiB.
//   Turing, Volta, Pascal: a T4's CUDA total is 15110 MiB of 15360 (~250 MiB driver share; deviceQuery
//            printed in chiemon.github.io's "显卡信息", 2024); a context costs 300-400 MB (pytorch/pytorch
//            issue #20532, V100, 2019) and a bare one 320 MB on a Titan V (pytorch/pytorch issue #28394,
//            where PyTorch 1.3 with all kernels loaded took ~1 GB). Estimate 250 + ~350 = 600 MiB.
// A 2020 framework that loaded every kernel eagerly held more (~1 GB, see above); these reserves are for
// this engine (cudart + cuBLASLt, lazy loading). To use a measured figure, pass --memory instead.
//
// Peak rates (dense, no sparsity; tensor cores with fp32 accumulation)
// ------------------------------------------------------------------
// Turing: NVIDIA Turing GPU Architecture whitepaper (reference boost clocks; the RTX 2060, released
// later, derived the same way: 1920 cores x 2 x 1.68 GHz, 240 tensor cores x 64 FMA x 2 x 1.68 GHz / 2
// for GeForce's half-rate fp32 accumulation). Titan RTX and Quadro RTX 6000/8000 accumulate in fp32 at
// full rate (130.5). GTX 1080 Ti: 3584 cores x 2 x 1.582 GHz, no tensor cores. T4, V100 (SXM2), A100
// (SXM4), L4, H100 (SXM5), H200 (SXM): the datasheets (the sparse figures halved). RTX 3090: Ampere
// GA102 whitepaper. RTX 4090: Ada Lovelace whitepaper.
#include "tools/gpu_profiles.h"

#include "engine/error.h"

namespace tools {

namespace {

constexpr size_t kReservePascalVoltaTuring = 600;
constexpr size_t kReserveAmpereDataCenter = 1000;
constexpr size_t kReserveGeForceAmpereAda = 700;
constexpr size_t kReserveHopper = 1320;
// Outside the arena (outside_mib): what cudaMemGetInfo counts as used besides the arena's cudaMalloc: the CUDA
// context, cuBLASLt's handle and the kernels' module images loaded on first launch. Hopper: MEASURED on the H200
// (driver 580, CUDA 13; BENCHMARKS.md, tools/bench/whole_device_gpu.sh): 529.8 to 533.8 MiB over four runs of
// three models (context 526.8, cuBLASLt 2.0, 1 to 5 loaded lazily), so 534. The others: ESTIMATES, their reserve
// less its driver share above (250, 620, 310 MiB).
constexpr size_t kOutsidePascalVoltaTuring = 350;
constexpr size_t kOutsideAmpereDataCenter = 380;
constexpr size_t kOutsideGeForceAmpereAda = 390;
constexpr size_t kOutsideHopper = 534;

}  // namespace

const std::vector<GpuProfile>& gpu_profiles() {
  //   name       product                        arch    memory  reserve                     fp32  tf32   bf16   fp16
  static const std::vector<GpuProfile> table = {
      {"rtx2060", "GeForce RTX 2060", "Turing", 6144, kReservePascalVoltaTuring, kOutsidePascalVoltaTuring, 6.5, 0, 0,
       25.8},
      {"rtx2070", "GeForce RTX 2070", "Turing", 8192, kReservePascalVoltaTuring, kOutsidePascalVoltaTuring, 7.5, 0, 0,
       29.9},
      {"rtx2080", "GeForce RTX 2080", "Turing", 8192, kReservePascalVoltaTuring, kOutsidePascalVoltaTuring, 10.1, 0, 0,
       40.3},
      {"gtx1080ti", "GeForce GTX 1080 Ti", "Pascal", 11264, kReservePascalVoltaTuring, kOutsidePascalVoltaTuring, 11.3,
       0, 0, 0},
      {"rtx2080ti", "GeForce RTX 2080 Ti", "Turing", 11264, kReservePascalVoltaTuring, kOutsidePascalVoltaTuring, 13.4,
       0, 0, 53.8},
      {"titanrtx", "TITAN RTX", "Turing", 24576, kReservePascalVoltaTuring, kOutsidePascalVoltaTuring, 16.3, 0, 0,
       130.5},
      {"rtx6000", "Quadro RTX 6000", "Turing", 24576, kReservePascalVoltaTuring, kOutsidePascalVoltaTuring, 16.3, 0, 0,
       130.5},
      {"rtx8000", "Quadro RTX 8000", "Turing", 49152, kReservePascalVoltaTuring, kOutsidePascalVoltaTuring, 16.3, 0, 0,
       130.5},
      {"t4", "Tesla T4", "Turing", 15360, kReservePascalVoltaTuring, kOutsidePascalVoltaTuring, 8.1, 0, 0, 65},
      {"v100-16", "Tesla V100-SXM2-16GB", "Volta", 16384, kReservePascalVoltaTuring, kOutsidePascalVoltaTuring, 15.7, 0,
       0, 125},
      {"v100-32", "Tesla V100-SXM2-32GB", "Volta", 32768, kReservePascalVoltaTuring, kOutsidePascalVoltaTuring, 15.7, 0,
       0, 125},
      {"a100-40", "NVIDIA A100-SXM4-40GB", "Ampere", 40960, kReserveAmpereDataCenter, kOutsideAmpereDataCenter, 19.5,
       156, 312, 312},
      {"a100-80", "NVIDIA A100-SXM4-80GB", "Ampere", 81920, kReserveAmpereDataCenter, kOutsideAmpereDataCenter, 19.5,
       156, 312, 312},
      {"rtx3090", "NVIDIA GeForce RTX 3090", "Ampere", 24576, kReserveGeForceAmpereAda, kOutsideGeForceAmpereAda, 35.6,
       35.6, 71, 71},
      {"rtx4090", "NVIDIA GeForce RTX 4090", "Ada", 24564, kReserveGeForceAmpereAda, kOutsideGeForceAmpereAda, 82.6,
       82.6, 165.2, 165.2},
      {"l4", "NVIDIA L4", "Ada", 23034, kReserveGeForceAmpereAda, kOutsideGeForceAmpereAda, 30.3, 60, 121, 121},
      {"h100", "NVIDIA H100 80GB HBM3", "Hopper", 81559, kReserveHopper, kOutsideHopper, 67, 494.7, 989.4, 989.4},
      {"h200", "NVIDIA H200", "Hopper", 143771, kReserveHopper, kOutsideHopper, 67, 494.7, 989.4, 989.4},
  };
  return table;
}

std::string gpu_profile_names() {
  std::string s;
  for (const auto& g : gpu_profiles()) s += (s.empty() ? "" : ", ") + std::string(g.name);
  return s;
}

const GpuProfile& find_gpu_profile(const std::string& name) {
  for (const auto& g : gpu_profiles())
    if (name == g.name) return g;
  throw engine::Error(engine::str("unknown gpu profile '", name, "': valid profiles are ", gpu_profile_names()));
}

size_t gpu_arena_capacity(const GpuProfile& gpu) { return (gpu.memory_mib - gpu.reserve_mib) << 20; }

double gpu_peak_tflops(const GpuProfile& gpu, const std::string& precision) {
  double tensor = 0;
  if (precision == "fp32") tensor = gpu.fp32_tflops;
  else if (precision == "tf32") tensor = gpu.tf32_tflops;
  else if (precision == "bf16") tensor = gpu.bf16_tflops;
  else if (precision == "fp16") tensor = gpu.fp16_tflops;
  else throw engine::Error(engine::str("gpu profile ", gpu.name, ": unknown precision '", precision,
                                       "': expected fp32, tf32, bf16 or fp16"));
  return tensor > 0 ? tensor : gpu.fp32_tflops;
}

}  // namespace tools
