// cuda_compare_util.h: checking a CUDA kernel against the cpu reference, for the *_cuda_test.cpp files.
//
//   cuda_device()                        the test binary's one cuda device (8 GiB arena), made on first use
//   to_cuda(t), to_cpu(t)                copies (contiguous); a tensor that requires grad gives a leaf that does
//   cpu_input(shape, dtype, ...)         fresh random values on the cpu (never zeros), optionally requiring grad
//   expect_close(what, cpu, other)       every element within atol + rtol * |cpu| (tolerance by dtype unless
//                                        given); a failure names what, dtype, shape, how many elements differ,
//                                        the worst one's index, both values and the max error
//   expect_equal(what, cpu, other)       the same values exactly (NaN equals NaN): masks, indices, copies
//   expect_cuda_matches_cpu(what, fn, inputs)
//                                        runs fn on the cpu inputs and on cuda copies of them, with the random
//                                        generator at the same state both times (dropout draws the same masks),
//                                        compares every output; then, when some input requires grad, backward
//                                        with the same random output gradients on both devices (graph::grad)
//                                        and compares every input's gradient
//   expect_cuda_ledger_matches_meta(program)
//                                        runs program on a fresh cuda device and on a fresh meta device (each
//                                        the default device meanwhile): their ledgers' events_csv() must be equal,
//                                        i.e. meta predicts every allocation of the GPU run (offset, size, tags)
//   expect_cuda_throws(what, fn, text)  fn on cuda throws an engine::Error whose message contains text, by the
//                                        next synchronization (an indexing op's out-of-range index surfaces
//                                        there: ops/cuda/kernel_util.cuh), and only once
//   measure_bandwidth(what, bytes, fn)   times fn on the GPU (warm-up, then the median of repeats, synchronized)
//                                        and prints bytes / time in GB/s: the perf mode of DISABLED_ tests
//
// Compiled into both test binaries; it calls only the engine's API, so it builds without CUDA too.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/tensor.h"
#include "tests/util/gradcheck_util.h"

namespace testutil {

using MultiFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// |cuda - cpu| <= atol + rtol * |cpu| per element. A negative atol means "the default for the dtype":
// f64 1e-12 + 1e-10 rel, f32 1e-5 + 1e-5 rel, f16 1e-3 + 2e-3 rel, bf16 1e-2 + 1e-2 rel, integers exact.
struct Tolerance {
  double atol = -1, rtol = -1;
};
Tolerance tolerance_for(engine::DType dtype);

std::shared_ptr<engine::Device> cuda_device();
Tensor to_cuda(const Tensor& t);
Tensor to_cpu(const Tensor& t);

// Uniform in [low, high) (floating dtypes) or integers in [0, high) (integer dtypes), from the engine's
// generator, on the cpu.
Tensor cpu_input(const engine::Shape& shape, engine::DType dtype, double low = -1.0, double high = 1.0,
                 bool requires_grad = false);

// "f32 [2, 3]"
std::string describe(const Tensor& t);

// Both return true when they pass, after adding a gtest failure when not.
bool expect_close(const std::string& what, const Tensor& cpu, const Tensor& other, Tolerance tol = {});
bool expect_equal(const std::string& what, const Tensor& cpu, const Tensor& other);

void expect_cuda_matches_cpu(const std::string& what, const Fn& fn, const std::vector<Tensor>& cpu_inputs,
                             Tolerance tol = {});
void expect_cuda_matches_cpu_multi(const std::string& what, const MultiFn& fn, const std::vector<Tensor>& cpu_inputs,
                                   Tolerance tol = {});

void expect_cuda_ledger_matches_meta(const std::function<void()>& program);

void expect_cuda_throws(const std::string& what, const std::function<void()>& fn, const std::string& text);

// Returns GB/s (bytes read + written per call of fn) and prints one line naming `what`.
double measure_bandwidth(const std::string& what, double bytes, const std::function<void()>& fn);
// Median wall time (ms) of fn on the cuda device over `reps` runs after a warm-up, synchronized each time.
double median_ms(const std::function<void()>& fn, int reps = 15);
// The same for `calls` launches of fn back to back, divided by calls: the time of one launch with the
// synchronization's cost spread over many (kernels shorter than the synchronization).
double median_ms_per_call(const std::function<void()>& fn, int calls, int reps = 7);

}  // namespace testutil
