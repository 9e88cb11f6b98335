// meta_util.h: the meta-device check every op test runs: the same program makes the same allocations
// (offsets and sizes, in the same order) on a fresh cpu device and a fresh meta device, which is what
// makes a meta run's memory prediction exact.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <utility>
#include <vector>

#include "engine/device.h"
#include "engine/tensor.h"

namespace testutil {

// Runs `program` once with a fresh cpu device as the default device and once with a fresh meta device;
// expects identical (offset, rounded bytes) allocation sequences and peaks.
inline void expect_meta_allocates_like_cpu(const std::function<void()>& program) {
  std::vector<std::pair<size_t, size_t>> blocks[2];
  size_t peak[2] = {0, 0};
  int k = 0;
  for (auto type : {engine::DeviceType::cpu, engine::DeviceType::meta}) {
    auto device = engine::Device::create(type, size_t(1) << 30);
    {
      engine::DeviceGuard guard(device);
      program();
    }
    for (const engine::BlockInfo& b : device->ledger().history()) blocks[k].push_back({b.offset, b.rounded});
    peak[k] = device->ledger().peak_bytes();
    k++;
  }
  EXPECT_FALSE(blocks[0].empty()) << "the program allocated nothing";
  EXPECT_EQ(blocks[0], blocks[1]) << "meta allocations differ from cpu";
  EXPECT_EQ(peak[0], peak[1]);
}

}  // namespace testutil
