// maskrcnn_reference_util.h: the check of the engine's Mask R-CNN against torchvision's with the same weights, on
// any device (the cpu suite runs it on tests/data/maskrcnn_reference.safetensors, torchvision's own modules at the
// tiny shapes; the CUDA suite on maskrcnn_resnet50_fpn itself at 800 x 1344, a file tools/bench/maskrcnn_parity.py
// --size full writes on the GPU machine). The file holds torchvision's state dict and, under "ref.", its inputs and
// outputs (the script's docstring lists them).
#pragma once
#include <memory>
#include <string>

#include "engine/device.h"

namespace testutil {

// Builds maskrcnn at `size` on `device`, loads the file's weights, and compares in fp32: the FPN levels, the RPN
// head's logits and codes, and on torchvision's own draw of RoIs the box head's outputs and the mask logits within
// `tol` (the largest difference over the largest reference value), the classifier, box and mask losses within 1e-4.
// Prints each error.
void expect_maskrcnn_matches_torchvision(const std::string& path, const std::string& size,
                                         std::shared_ptr<engine::Device> device, double tol = 1e-5);

}  // namespace testutil
