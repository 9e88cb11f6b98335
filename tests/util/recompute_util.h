// recompute_util.h: the check every model's --recompute layer passes (activation checkpointing must be the
// same computation with less memory).
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "engine/device.h"
#include "models/registry.h"
#include "ops/elementwise.h"

namespace testutil {

// Trains `tiny` two steps on the cpu with --recompute none and with `mode` (layer; NASNet's cell): the losses,
// every parameter and every buffer (batch norm's running statistics: updated once, not again when a block runs a
// second time) are equal bit for bit, and meta makes the cpu's allocations with recompute. Then `full` (a full
// size) takes two meta steps both ways: the recomputed peak is below `max_fraction` of the plain one.
inline void expect_recompute_layer_is_exact(models::ModelConfig tiny, models::ModelConfig full, double max_fraction,
                                            const std::string& mode = "layer") {
  using engine::Device;
  using engine::DeviceType;
  using engine::Tensor;
  auto train = [&tiny](const std::string& recompute, DeviceType type) {
    auto dev = Device::create(type, type == DeviceType::cpu ? size_t(1) << 32 : size_t(1) << 40);
    engine::DeviceGuard guard(dev);
    models::ModelConfig c = tiny;
    c.recompute = recompute;
    auto model = models::create_model(c);
    std::vector<double> losses;
    for (int s = 1; s <= 2; s++) losses.push_back(model->train_step(s).loss);
    const std::string csv = dev->ledger().events_csv();  // before the copies below allocate
    std::vector<std::vector<double>> state;
    auto values = [](const Tensor& t) {
      Tensor d = ops::contiguous(ops::to(t, engine::DType::f64));
      return std::vector<double>(d.data<double>(), d.data<double>() + d.numel());
    };
    if (type == DeviceType::cpu) {
      for (const auto& [name, p] : model->module().named_parameters()) state.push_back(values(p));
      for (const auto& [name, b] : model->module().named_buffers()) state.push_back(values(b));
    }
    return std::make_tuple(losses, state, csv);
  };
  const auto [plain_losses, plain_state, plain_csv] = train("none", DeviceType::cpu);
  const auto [losses, state, csv] = train(mode, DeviceType::cpu);
  EXPECT_EQ(losses, plain_losses) << tiny.name;
  ASSERT_EQ(state.size(), plain_state.size());
  for (size_t i = 0; i < state.size(); i++)
    EXPECT_EQ(state[i], plain_state[i]) << tiny.name << " parameter or buffer " << i;
  EXPECT_EQ(std::get<2>(train(mode, DeviceType::meta)), csv) << tiny.name << ": meta makes the cpu's allocations";

  auto peak = [&full](const std::string& recompute) {
    auto dev = Device::create(DeviceType::meta, size_t(1) << 40);
    engine::DeviceGuard guard(dev);
    models::ModelConfig c = full;
    c.recompute = recompute;
    auto model = models::create_model(c);
    for (int s = 1; s <= 2; s++) model->train_step(s);
    return dev->ledger().peak_bytes();
  };
  const size_t plain = peak("none"), recomputed = peak(mode);
  EXPECT_LT(double(recomputed), max_fraction * double(plain)) << full.name << ": " << plain << " -> " << recomputed;
}

}  // namespace testutil
