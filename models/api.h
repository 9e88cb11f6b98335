// api.h: the engine's public header for applications: everything needed to build a model (one of the registry's
// or your own Modules), choose a device, run training or eval steps and read the ledger.
//
// Installed by `make install PREFIX=DIR` with every header under DIR/include/engine, the library as
// DIR/lib/libengine.a and DIR/lib/pkgconfig/engine.pc, so an application builds with
//   g++ app.cpp $(pkg-config --cflags --libs engine) -o app     (PKG_CONFIG_PATH=DIR/lib/pkgconfig)
// tools/examples/custom_model.cpp is such an application (make test builds it against an installed copy and runs
// it). In short:
//
//   auto device = engine::Device::create(engine::DeviceType::meta, size_t(1) << 40);  // or cpu, cuda
//   engine::DeviceGuard guard(device);                 // new tensors go to this device
//   models::ModelConfig c;  c.name = "bert_base";  c.seq = 512;     // as engine_train's flags
//   std::unique_ptr<models::Model> model = models::create_model(c);
//   for (int64_t step = 1; step <= 2; step++) model->train_step(step);
//   device->ledger().peak_bytes();                     // the exact peak; peak_table_markdown() says who holds it
//
// Your own model: a graph::Module of models::nn layers and ops (autograd records every op), wrapped in a
// models::Model that makes batches and a loss (see the example). The layers of the dependency order are
// engine (devices, tensors, the arena and ledger) < graph (autograd, modules) < ops < models.
#pragma once

#include "engine/context.h"
#include "engine/device.h"
#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/format.h"
#include "engine/ledger.h"
#include "engine/rng.h"
#include "engine/safetensors.h"
#include "engine/tensor.h"
#include "graph/autograd.h"
#include "graph/module.h"
#include "models/hf_config.h"
#include "models/model.h"
#include "models/nn/attention.h"
#include "models/nn/layers.h"
#include "models/nn/transformer.h"
#include "models/precision.h"
#include "models/registry.h"
#include "ops/attention.h"
#include "ops/batch_norm.h"
#include "ops/conv.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/factory.h"
#include "ops/loss.h"
#include "ops/lr_schedule.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/optimizer.h"
#include "ops/pool.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "ops/softmax.h"
#include "ops/view.h"
