// gpu_profiles.h: the named GPUs that `--gpu NAME` stands for: memory, what a process cannot use of it,
// and peak arithmetic rates.
//
// A profile lets a meta run answer "what fits on a 2080 Ti?" on any laptop: the arena's capacity is the
// card's memory less a reserve (memory the driver keeps + the CUDA context + the GEMM library), exactly
// what a training process on that card could hand to its allocator. The peak rates are the datasheets'
// dense figures (no structured sparsity), for MFU. Every number and its source is in gpu_profiles.cpp;
// the reserves are estimates (see the note there), so --memory remains the way to state a measured one.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace tools {

struct GpuProfile {
  const char* name;     // the --gpu name, also the column name in lambda2020.csv
  const char* product;  // as nvidia-smi names it
  const char* arch;     // Pascal, Volta, Turing, Ampere, Ada, Hopper
  size_t memory_mib;    // total memory as nvidia-smi reports it (recent drivers)
  size_t reserve_mib;   // not available to the arena: driver-reserved + CUDA context + cuBLASLt (estimate)
  size_t outside_mib;   // cudaMemGetInfo's count outside the arena: context, cuBLASLt, kernels (measured on H200)
  // Peak dense TFLOP/s. Tensor-core rates are with fp32 accumulation (what mixed-precision training
  // uses; GeForce Turing/Ampere/Ada run it at half their fp16-accumulate rate). 0: no such hardware path.
  double fp32_tflops, tf32_tflops, bf16_tflops, fp16_tflops;
};

// Every profile, the 2020 study's eight cards first.
const std::vector<GpuProfile>& gpu_profiles();
// "rtx2060, rtx2070, ..." for help texts and errors.
std::string gpu_profile_names();
// The profile called `name`; an unknown name is an Error listing the profiles.
const GpuProfile& find_gpu_profile(const std::string& name);
// Bytes the arena gets on that card: (memory - reserve) MiB.
size_t gpu_arena_capacity(const GpuProfile& gpu);
// Peak dense TFLOP/s at a precision (fp32 | tf32 | bf16 | fp16). A card without the tensor-core path
// (tf32 before Ampere, bf16 before Ampere, fp16 on Pascal) runs that precision's GEMMs at its fp32 rate,
// so that is returned; an unknown precision is an Error.
double gpu_peak_tflops(const GpuProfile& gpu, const std::string& precision);

}  // namespace tools
