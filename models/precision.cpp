// precision.cpp: precision names, lowering parameters to bf16/f16 with f32 masters, fp16 loss scaling.
#include "models/precision.h"

#include <set>

#include "engine/context.h"
#include "engine/error.h"
#include "graph/autograd.h"
#include "ops/elementwise.h"

namespace models {

using engine::Tensor;

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::tf32: return "tf32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
  }
  return "?";
}

Precision precision_from_name(const std::string& name) {
  for (Precision p : {Precision::fp32, Precision::tf32, Precision::bf16, Precision::fp16})
    if (name == precision_name(p)) return p;
  throw engine::Error(engine::str("unknown precision '", name, "': valid precisions are fp32, tf32, bf16, fp16"));
}

engine::DType compute_dtype(Precision p) {
  switch (p) {
    case Precision::bf16: return engine::DType::bf16;
    case Precision::fp16: return engine::DType::f16;
    default: return engine::DType::f32;
  }
}

void lower_parameters(const graph::Module& module, const std::vector<ops::Optimizer*>& optimizers,
                      engine::DType dtype) {
  graph::NoGrad no_grad;
  std::set<const engine::TensorImpl*> done;  // a tied weight appears once per module that holds it
  for (auto& [name, p] : module.named_parameters()) {
    if (!engine::is_floating(p.dtype()) || p.dtype() == dtype || !done.insert(p.impl()).second) continue;
    ENGINE_CHECK(p.dtype() == engine::DType::f32, "precision: parameter '", name, "' is ",
                 engine::dtype_name(p.dtype()), "; mixed precision lowers f32 parameters");
    // The master: a new handle on the original f32 storage (its values are the exact initialization).
    Tensor master = Tensor::view_of(p, p.shape(), p.strides(), p.offset());
    Tensor low;
    {
      engine::CategoryScope category(engine::Category::param);
      low = ops::to(p.detach(), dtype);
    }
    low.storage()->set_owner(name);
    // Every holder of p's handle (module, optimizer, tied modules) now sees the low-precision tensor.
    engine::TensorImpl* impl = p.impl();
    impl->storage = low.storage();
    impl->dtype = dtype;
    impl->offset = low.offset();
    impl->strides = low.strides();
    ops::Optimizer* owner = nullptr;  // the optimizer that updates this parameter, if any
    for (ops::Optimizer* o : optimizers)
      if (!owner && o->holds(name)) owner = o;
    if (owner) owner->set_master_weight(name, master);  // else (frozen, or inference) the f32 storage is freed here
  }
}

bool LossScaler::update(bool finite) {
  if (!finite) {
    scale *= backoff;
    good_steps = 0;
    skipped++;
    return false;
  }
  if (++good_steps >= growth_interval) {
    scale *= growth;
    good_steps = 0;
  }
  return true;
}

}  // namespace models
