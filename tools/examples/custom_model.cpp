// custom_model.cpp: an application of the engine's public API (models/api.h), built against an installed copy
// (make install; make test builds and runs it): a model of its own, a two-layer MLP classifier, its exact memory
// on the meta device, the same steps on the cpu (the loss falls, the peak is the same byte for byte), and a model
// of the registry by name.
#include <cstdio>
#include <memory>

#include "models/api.h"

using engine::Tensor;

namespace {

// The network: 256 inputs -> 512 ReLU -> 10 classes.
class Mlp : public graph::Module {
 public:
  Mlp() {
    fc1 = register_module("fc1", std::make_shared<models::nn::Linear>(256, 512));
    fc2 = register_module("fc2", std::make_shared<models::nn::Linear>(512, 10));
  }
  Tensor forward(const Tensor& x) const { return fc2->forward(ops::relu(fc1->forward(x))); }
  std::shared_ptr<models::nn::Linear> fc1, fc2;
};

// The model: batches of `batch` (64) random inputs whose class is the index of their largest of the first 10
// features (learnable), cross-entropy, Adam.
class MlpModel : public models::Model {
 public:
  explicit MlpModel(int64_t batch = 64) : net_(std::make_shared<Mlp>()), batch_(batch) {
    net_->tag_memory();
    ops::AdamOptions o;
    o.lr = 1e-3;
    optimizer_ = std::make_unique<ops::Adam>(net_->named_parameters(), o);
  }
  graph::Module& module() override { return *net_; }
  std::string summary() const override { return engine::str("mlp: 256 -> 512 -> 10, batch ", batch_); }
  const char* item_unit() const override { return "img"; }
  int64_t batch_size() const override { return batch_; }

 protected:
  models::Batch make_batch(int64_t step) override {
    engine::manual_seed(uint64_t(step));
    Tensor x = ops::randn({batch_, 256});
    Tensor y = ops::argmax(ops::slice(x, 1, 0, 10), 1);  // [batch] i64
    return {{"x", x}, {"y", y}};
  }
  Tensor loss(const models::Batch& b) override { return ops::cross_entropy(net_->forward(b.at("x")), b.at("y")); }
  int64_t items(const models::Batch& b) const override { return b.at("x").size(0); }

 private:
  std::shared_ptr<Mlp> net_;
  int64_t batch_;
};

size_t rounded(size_t bytes) { return (bytes + 255) / 256 * 256; }  // the arena's 256-byte blocks

// The peak engine/README.md's worked example computes by hand: parameters P, their gradients P, Adam's two states
// 2P, the gradient flowing into fc1 [B, 512], the batch [B, 256], the loss scalar, and the GEMM workspace.
size_t peak_by_hand(const graph::Module& net, int64_t batch, size_t workspace) {
  size_t params = 0;
  for (const auto& [name, p] : net.named_parameters()) params += rounded(p.nbytes());
  return 4 * params + rounded(size_t(batch) * 512 * 4) + rounded(size_t(batch) * 256 * 4) + rounded(4) + workspace;
}

// Trains `steps` steps on a fresh device of `type`; returns the peak and the first and last losses, and the
// worked example's figure for it.
size_t train(engine::DeviceType type, int steps, double* first, double* last, size_t* by_hand, int64_t batch = 64) {
  auto device = engine::Device::create(type, size_t(1) << 30);
  engine::DeviceGuard guard(device);
  MlpModel model(batch);
  for (int step = 1; step <= steps; step++) {
    const double loss = model.train_step(step).loss;
    if (step == 1) *first = loss;
    *last = loss;
  }
  if (type == engine::DeviceType::meta) {
    const engine::BlockInfo moment = device->ledger().peak_groups(1).moment;
    std::printf("%s\nthe peak came at the allocation of %s, phase %s\n",
                device->ledger().peak_table_markdown(1).c_str(), moment.owner.c_str(),
                engine::phase_name(moment.phase));
  }
  *by_hand = peak_by_hand(model.module(), batch, device->ledger().live_bytes(engine::Category::workspace));
  return device->ledger().peak_bytes();
}

}  // namespace

int main() {
  try {
    double first = 0, last = 0;
    size_t by_hand = 0;
    const size_t meta = train(engine::DeviceType::meta, 2, &first, &last, &by_hand);
    std::printf("mlp peak on meta: %s (%zu bytes); by hand (engine/README.md): %zu bytes\n",
                engine::format_bytes(meta).c_str(), meta, by_hand);
    const size_t cpu = train(engine::DeviceType::cpu, 200, &first, &last, &by_hand);
    std::printf("mlp on cpu: loss %.4f -> %.4f over 200 steps, peak %zu bytes\n", first, last, cpu);
    if (cpu != meta || meta != by_hand || !(last < 0.5 * first)) {
      std::printf("FAILED: %s\n", cpu != meta       ? "the cpu's peak differs from meta's"
                                  : meta != by_hand ? "the peak differs from the worked example's sum"
                                                    : "the loss did not fall");
      return 1;
    }
    // engine/README.md's exercise 1: the same MLP at batch 128, its peak predicted there as 36,136,192 B.
    const size_t at128 = train(engine::DeviceType::meta, 2, &first, &last, &by_hand, 128);
    std::printf("mlp at batch 128 on meta: peak %zu bytes; the exercise's answer 36136192\n", at128);
    if (at128 != 36136192 || at128 != by_hand) {
      std::printf("FAILED: exercise 1's answer does not hold\n");
      return 1;
    }
    // A model of the registry, by name, as engine_train --model bert_base --seq 512 --device meta.
    auto device = engine::Device::create(engine::DeviceType::meta, size_t(1) << 40);
    engine::DeviceGuard guard(device);
    models::ModelConfig c;
    c.name = "bert_base";
    c.seq = 512;
    c.batch = 8;
    std::unique_ptr<models::Model> bert = models::create_model(c);
    for (int64_t step = 1; step <= 2; step++) bert->train_step(step);
    std::printf("%s\nbert_base seq 512 x 8 peak on meta: %s\n", bert->summary().c_str(),
                engine::format_bytes(device->ledger().peak_bytes()).c_str());
    return 0;
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 2;
  }
}
