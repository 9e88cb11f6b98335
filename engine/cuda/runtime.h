// runtime.h: the CUDA runtime as the engine uses it: one device, one stream, one cuBLASLt handle, and
// checked calls. Included only by CUDA code (engine/cuda/, ops/cuda/), never by the cpu/meta build.
//
// Every CUDA and cuBLASLt call goes through ENGINE_CUDA_CHECK / ENGINE_CUBLAS_CHECK, and every kernel
// launch is followed by ENGINE_CUDA_LAUNCH_CHECK("op"): a failure becomes an engine::Error naming the op,
// the call, and the file and line, never a silent wrong result.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "engine/error.h"

namespace engine::cuda {

void check(cudaError_t e, const char* what, const char* file, int line);
void check(cublasStatus_t s, const char* what, const char* file, int line);

// Makes this process's GPU the current one and returns its ordinal: GPU LOCAL_RANK for a rank of a world on one host
// (as torchrun sets it, with WORLD_SIZE; modulo the GPUs it sees), else GPU 0. An Error naming the fix when no GPU
// is visible. The cuda device and the NCCL communicator call it, whichever comes first.
int select_rank_gpu();
// Something made on the GPU before the cuda device (NCCL's communicator) names the device memory it took; the device
// made next lists it among what is outside its arena, apart from the CUDA context.
void note_outside_arena(const char* what, size_t bytes);
cudaStream_t stream();          // the engine's one stream
cublasLtHandle_t cublaslt();    // created with the device
int multiprocessors();          // SM count of the device
int compute_capability();       // of the device: major * 10 + minor (90 for the H200)

// Checks that wait for the stream (ops/cuda's out-of-range index records): `check` runs after every
// synchronization of the engine's stream by the device (Device::synchronize, copies to and from the host) and
// may throw. Registering the same function again does nothing.
void on_synchronized(void (*check)());
// Synchronizes the engine's stream, then runs the registered checks.
void synchronize_and_check();

}  // namespace engine::cuda

#define ENGINE_CUDA_CHECK(call) ::engine::cuda::check((call), #call, __FILE__, __LINE__)

namespace engine::cuda {
// Raises a kernel's dynamic shared-memory limit to `bytes` (beyond the default 48 KB). A launcher whose kernel and
// bytes are fixed calls it once, from a static of its own: `static const bool configured = set_smem_limit(k, n);`
// (kernels of different template arguments share one function type, so the static cannot live here).
template <typename Kernel>
bool set_smem_limit(Kernel kernel, int bytes) {
  ENGINE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  return true;
}
}  // namespace engine::cuda
#define ENGINE_CUBLAS_CHECK(call) ::engine::cuda::check((call), #call, __FILE__, __LINE__)
#define ENGINE_CUDA_LAUNCH_CHECK(op) \
  ::engine::cuda::check(cudaGetLastError(), op " (kernel launch)", __FILE__, __LINE__)
