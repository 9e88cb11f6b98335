// nasnet_reference_util.h: the check of the engine's NASNet against timm's on a small network, on any device (the
// cpu suite and the CUDA suite run it): tests/data/nasnet_reference.safetensors, written by
// tools/bench/nasnet_parity.py --reference with timm, holds timm's NASNetALarge(num_classes=5, stem_size=8,
// num_features=192) (the 22-cell network at 8 filters, batch norms perturbed), a 96 x 96 batch of 2, and in
// float64: the logits, the loss, every parameter's gradient and the loss after one update of the recipe.
#pragma once
#include <memory>

#include "engine/device.h"

namespace testutil {

// With batch norm in training mode, fp32 on `device`: logits and loss within 1e-4 (relative), every gradient
// within grad_tol of its parameter's largest gradient, one optimizer step (clipping at 10, L2 5e-5 on the weights,
// TensorFlow's RMSProp) within grad_tol of the update the reference's gradients give, and the loss after it
// within 5e-4 of timm's float64 one. grad_tol: fp32's rounding grows ~1.3x per cell in this network (1e-6 at
// conv0, 4e-4 at cell_17 against float64), which leaves gradients ~1e-3 of their largest from float64's.
void expect_nasnet_matches_timm_reference(std::shared_ptr<engine::Device> device, double grad_tol = 3e-3);

}  // namespace testutil
