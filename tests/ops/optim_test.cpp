// optim_test.cpp: each optimizer over several steps against its update formulas written out here as plain
// scalar loops (textbook form, not the kernels' operation order); lazy state in the ledger; skipped
// parameters; checkpoint round trip of the state. Gradient clipping: grad_clip_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <unistd.h>

#include "engine/safetensors.h"
#include "graph/autograd.h"
#include "graph/module.h"
#include "ops/factory.h"
#include "ops/optimizer.h"

using engine::Category;
using engine::DType;
using engine::Shape;
using engine::Tensor;
using Vec = std::vector<double>;

namespace {

// Two parameters of different shapes; their gradients change with the step and have both signs.
const std::vector<std::string> kNames = {"layer.weight", "layer.bias"};
const std::vector<Shape> kShapes = {{2, 3}, {4}};

Vec initial_values(size_t k) {
  Vec v(size_t(engine::numel_of(kShapes[k])));
  for (size_t i = 0; i < v.size(); i++) v[i] = 0.3 * double(i) - 0.5 + 0.1 * double(k);
  return v;
}

Vec gradient(size_t k, size_t n, int step) {
  Vec g(n);
  for (size_t i = 0; i < n; i++) g[i] = std::sin(1.3 * double(i) + 0.7 * step + double(k)) * double(k + 1);
  return g;
}

// The reference: one update of parameter k (values p, gradient g) at its step t (1-based) with rate lr.
using RefStep = std::function<void(size_t k, Vec& p, const Vec& g, int t, double lr)>;
using MakeOpt = std::function<std::unique_ptr<ops::Optimizer>(const ops::NamedTensors&)>;

ops::NamedTensors make_params(DType dtype, std::vector<Vec>& host) {
  ops::NamedTensors params;
  host.clear();
  for (size_t k = 0; k < kShapes.size(); k++) {
    host.push_back(initial_values(k));
    Tensor t = ops::from_vector(host[k], kShapes[k], dtype);
    t.set_requires_grad(true);
    params.emplace_back(kNames[k], t);
  }
  return params;
}

// Runs `steps` steps with a learning rate that changes every step and compares after each one.
void expect_matches_reference(const MakeOpt& make, const RefStep& ref, int steps = 5, DType dtype = DType::f64,
                              double tol = 1e-12) {
  std::vector<Vec> host;
  ops::NamedTensors params = make_params(dtype, host);
  std::unique_ptr<ops::Optimizer> opt = make(params);
  double base_lr = opt->lr();
  for (int s = 0; s < steps; s++) {
    double lr = base_lr * (1.0 - 0.15 * s);
    opt->set_lr(lr);
    std::vector<Vec> grads;
    for (size_t k = 0; k < params.size(); k++) {
      grads.push_back(gradient(k, host[k].size(), s));
      params[k].second.set_grad(ops::from_vector(grads[k], kShapes[k], dtype));
    }
    opt->step();
    for (size_t k = 0; k < params.size(); k++) {
      ref(k, host[k], grads[k], s + 1, lr);
      Vec got = params[k].second.to_double();
      for (size_t i = 0; i < got.size(); i++)
        ASSERT_NEAR(got[i], host[k][i], tol * (1 + std::abs(host[k][i])))
            << opt->name() << " step " << s + 1 << " param " << kNames[k] << " element " << i;
    }
  }
  EXPECT_EQ(opt->step_count(), steps);
}

// Per-parameter state of a reference, zero-initialized on first use.
struct RefState {
  std::map<std::pair<size_t, int>, Vec> slots;
  Vec& get(size_t k, int slot, size_t n, double init = 0.0) {
    auto it = slots.find({k, slot});
    if (it == slots.end()) it = slots.emplace(std::make_pair(k, slot), Vec(n, init)).first;
    return it->second;
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------------
// SGD

TEST(Optim, SgdVariantsMatchFormulas) {
  struct Case { double momentum, dampening, wd; bool nesterov; };
  for (Case c : {Case{0, 0, 0, false}, Case{0, 0, 0.05, false}, Case{0.9, 0.1, 0.01, false},
                 Case{0.9, 0, 0.01, true}}) {
    SCOPED_TRACE(testing::Message() << "momentum " << c.momentum << " dampening " << c.dampening << " wd " << c.wd
                                    << " nesterov " << c.nesterov);
    RefState st;
    RefStep ref = [&](size_t k, Vec& p, const Vec& g, int t, double lr) {
      Vec& buf = st.get(k, 0, p.size());
      for (size_t i = 0; i < p.size(); i++) {
        double d = g[i] + c.wd * p[i];
        if (c.momentum != 0) {
          buf[i] = t == 1 ? d : c.momentum * buf[i] + (1 - c.dampening) * d;
          d = c.nesterov ? d + c.momentum * buf[i] : buf[i];
        }
        p[i] -= lr * d;
      }
    };
    expect_matches_reference(
        [&](const ops::NamedTensors& p) {
          return std::make_unique<ops::Sgd>(p, ops::SgdOptions{0.1, c.momentum, c.dampening, c.wd, c.nesterov});
        },
        ref);
  }
}

// ---------------------------------------------------------------------------------------------------
// Adam, AdamW

TEST(Optim, AdamAndAdamWMatchFormulas) {
  for (bool decoupled : {false, true}) {
    SCOPED_TRACE(decoupled ? "adamw" : "adam");
    const double b1 = 0.8, b2 = 0.95, eps = 1e-3, wd = 0.1;
    RefState st;
    RefStep ref = [&](size_t k, Vec& p, const Vec& g, int t, double lr) {
      Vec& m = st.get(k, 0, p.size());
      Vec& v = st.get(k, 1, p.size());
      for (size_t i = 0; i < p.size(); i++) {
        double gi = decoupled ? g[i] : g[i] + wd * p[i];
        if (decoupled) p[i] -= lr * wd * p[i];
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        double m_hat = m[i] / (1 - std::pow(b1, t));
        double v_hat = v[i] / (1 - std::pow(b2, t));
        p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
      }
    };
    expect_matches_reference(
        [&](const ops::NamedTensors& p) -> std::unique_ptr<ops::Optimizer> {
          ops::AdamOptions o{0.05, b1, b2, eps, wd};
          if (decoupled) return std::make_unique<ops::AdamW>(p, o);
          return std::make_unique<ops::Adam>(p, o);
        },
        ref);
  }
}

TEST(Optim, AdamWExcludedParametersGetNoDecay) {
  const double wd = 0.5;
  RefState st;
  RefStep ref = [&](size_t k, Vec& p, const Vec& g, int t, double lr) {
    double decay = kNames[k] == "layer.bias" ? 0.0 : wd;
    Vec& m = st.get(k, 0, p.size());
    Vec& v = st.get(k, 1, p.size());
    for (size_t i = 0; i < p.size(); i++) {
      p[i] *= 1 - lr * decay;
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i];
      p[i] -= lr * (m[i] / (1 - std::pow(0.9, t))) / (std::sqrt(v[i] / (1 - std::pow(0.999, t))) + 1e-8);
    }
  };
  expect_matches_reference(
      [&](const ops::NamedTensors& p) {
        auto opt = std::make_unique<ops::AdamW>(p, ops::AdamOptions{0.01, 0.9, 0.999, 1e-8, wd});
        opt->exclude_from_weight_decay([](const std::string& n) { return n.find("bias") != std::string::npos; });
        return opt;
      },
      ref, 3);
}

TEST(Optim, AdamInF32AgreesWithF64Formulas) {
  RefState st;
  RefStep ref = [&](size_t k, Vec& p, const Vec& g, int t, double lr) {
    Vec& m = st.get(k, 0, p.size());
    Vec& v = st.get(k, 1, p.size());
    for (size_t i = 0; i < p.size(); i++) {
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i];
      p[i] -= lr * (m[i] / (1 - std::pow(0.9, t))) / (std::sqrt(v[i] / (1 - std::pow(0.999, t))) + 1e-8);
    }
  };
  expect_matches_reference(
      [](const ops::NamedTensors& p) { return std::make_unique<ops::Adam>(p, ops::AdamOptions{0.01}); }, ref, 4,
      DType::f32, 1e-6);
}

// ---------------------------------------------------------------------------------------------------
// Adamax

TEST(Optim, AdamaxMatchesFormulas) {
  const double b1 = 0.9, b2 = 0.99, eps = 1e-2, wd = 0.05;
  RefState st;
  RefStep ref = [&](size_t k, Vec& p, const Vec& g, int t, double lr) {
    Vec& m = st.get(k, 0, p.size());
    Vec& u = st.get(k, 1, p.size());
    for (size_t i = 0; i < p.size(); i++) {
      double gi = g[i] + wd * p[i];
      m[i] = b1 * m[i] + (1 - b1) * gi;
      u[i] = std::max(b2 * u[i], std::abs(gi) + eps);
      p[i] -= lr / (1 - std::pow(b1, t)) * m[i] / u[i];
    }
  };
  expect_matches_reference(
      [&](const ops::NamedTensors& p) {
        return std::make_unique<ops::Adamax>(p, ops::AdamaxOptions{0.02, b1, b2, eps, wd});
      },
      ref);
}

// ---------------------------------------------------------------------------------------------------
// RMSProp: PyTorch (eps outside the sqrt, mean square from 0) and TensorFlow (eps inside, from 1)

TEST(Optim, RmsPropPyTorchStyleMatchesFormulas) {
  struct Case { double momentum; bool centered; };
  for (Case c : {Case{0, false}, Case{0.9, false}, Case{0.5, true}}) {
    SCOPED_TRACE(testing::Message() << "momentum " << c.momentum << " centered " << c.centered);
    const double alpha = 0.9, eps = 1e-3, wd = 0.01;
    RefState st;
    RefStep ref = [&](size_t k, Vec& p, const Vec& g, int, double lr) {
      Vec& v = st.get(k, 0, p.size());
      Vec& buf = st.get(k, 1, p.size());
      Vec& ga = st.get(k, 2, p.size());
      for (size_t i = 0; i < p.size(); i++) {
        double gi = g[i] + wd * p[i];
        v[i] = alpha * v[i] + (1 - alpha) * gi * gi;
        double mean_sq = v[i];
        if (c.centered) {
          ga[i] = alpha * ga[i] + (1 - alpha) * gi;
          mean_sq -= ga[i] * ga[i];
        }
        double d = std::sqrt(mean_sq) + eps;
        if (c.momentum != 0) {
          buf[i] = c.momentum * buf[i] + gi / d;
          p[i] -= lr * buf[i];
        } else {
          p[i] -= lr * gi / d;
        }
      }
    };
    expect_matches_reference(
        [&](const ops::NamedTensors& p) {
          return std::make_unique<ops::RmsProp>(p, ops::RmsPropOptions{0.01, alpha, eps, wd, c.momentum, c.centered});
        },
        ref);
  }
}

TEST(Optim, RmsPropTensorFlowStyleMatchesFormulas) {
  // NASNet's recipe: decay 0.9, momentum 0.9, eps 1.0.
  for (bool centered : {false, true}) {
    SCOPED_TRACE(centered ? "centered" : "plain");
    const double rho = 0.9, momentum = 0.9, eps = 1.0, wd = 4e-5;
    RefState st;
    RefStep ref = [&](size_t k, Vec& p, const Vec& g, int, double lr) {
      Vec& ms = st.get(k, 0, p.size(), 1.0);  // TF's "rms" slot starts at ones
      Vec& mom = st.get(k, 1, p.size());
      Vec& mg = st.get(k, 2, p.size());
      for (size_t i = 0; i < p.size(); i++) {
        double gi = g[i] + wd * p[i];
        ms[i] = rho * ms[i] + (1 - rho) * gi * gi;
        double denom = ms[i] + eps;
        if (centered) {
          mg[i] = rho * mg[i] + (1 - rho) * gi;
          denom -= mg[i] * mg[i];
        }
        mom[i] = momentum * mom[i] + lr * gi / std::sqrt(denom);
        p[i] -= mom[i];
      }
    };
    expect_matches_reference(
        [&](const ops::NamedTensors& p) {
          return std::make_unique<ops::RmsProp>(p,
                                                ops::RmsPropOptions{0.045, rho, eps, wd, momentum, centered, true});
        },
        ref);
  }
}

// ---------------------------------------------------------------------------------------------------
// Skipped parameters, state in the ledger

TEST(Optim, ParameterWithoutGradIsSkippedAndKeepsItsOwnStepCount) {
  std::vector<Vec> host;
  ops::NamedTensors params = make_params(DType::f64, host);
  ops::Adam opt(params, ops::AdamOptions{0.1});
  Tensor& w = params[0].second;
  Tensor& b = params[1].second;
  // Step 1: only w has a gradient; b must not move.
  w.set_grad(ops::from_vector(gradient(0, 6, 0), kShapes[0], DType::f64));
  opt.step();
  EXPECT_EQ(b.to_double(), host[1]);
  ops::OptimizerState s = opt.state();
  EXPECT_EQ(s.tensors.size(), 2u);  // only w's slots exist
  EXPECT_EQ(s.metadata.count("optimizer.step.layer.bias"), 0u);
  // Step 2: b's first update uses bias correction t = 1: p -= lr * g / (|g| + eps) elementwise.
  opt.zero_grad();
  Vec g = gradient(1, 4, 1);
  b.set_grad(ops::from_vector(g, kShapes[1], DType::f64));
  opt.step();
  Vec got = b.to_double();
  for (size_t i = 0; i < g.size(); i++) EXPECT_NEAR(got[i], host[1][i] - 0.1 * g[i] / (std::abs(g[i]) + 1e-8), 1e-12);
  s = opt.state();
  EXPECT_EQ(s.metadata.at("optimizer.step"), "2");
  EXPECT_EQ(s.metadata.at("optimizer.step.layer.weight"), "1");
  EXPECT_EQ(s.metadata.at("optimizer.step.layer.bias"), "1");
}

// Parameters at different step counts get different bias corrections, so one step() updates them in separate
// groups (ops/optimizer.cpp): b's first update (t = 1) has the closed form p -= lr * g / (|g| + eps), and w's
// second matches an optimizer that holds w alone.
TEST(Optim, ParametersAtDifferentStepCountsAreUpdatedInTheirOwnGroups) {
  std::vector<Vec> host;
  ops::NamedTensors params = make_params(DType::f64, host);
  ops::Adam opt(params, ops::AdamOptions{0.1});
  Tensor& w = params[0].second;
  Tensor& b = params[1].second;
  Tensor w_alone = ops::from_vector(host[0], kShapes[0], DType::f64);
  ops::Adam alone({{"layer.weight", w_alone}}, ops::AdamOptions{0.1});
  for (int step = 0; step < 2; step++) {
    Vec gw = gradient(0, 6, step);
    w.set_grad(ops::from_vector(gw, kShapes[0], DType::f64));
    w_alone.set_grad(ops::from_vector(gw, kShapes[0], DType::f64));
    if (step == 1) b.set_grad(ops::from_vector(gradient(1, 4, 1), kShapes[1], DType::f64));
    opt.step();
    alone.step();
  }
  EXPECT_EQ(w.to_double(), w_alone.to_double());
  const Vec g = gradient(1, 4, 1), got = b.to_double();
  for (size_t i = 0; i < g.size(); i++) EXPECT_NEAR(got[i], host[1][i] - 0.1 * g[i] / (std::abs(g[i]) + 1e-8), 1e-12);
}

namespace {
// Adam state bytes after the first step, on the device `dev`.
size_t adam_state_bytes(std::shared_ptr<engine::Device> dev, size_t* param_bytes) {
  engine::DeviceGuard guard(dev);
  graph::Module m;
  m.register_parameter("weight", ops::zeros({100, 30}));
  m.register_parameter("bias", ops::zeros({30}));
  ops::Adam opt(m.named_parameters(), ops::AdamOptions{});
  EXPECT_EQ(dev->ledger().live_bytes(Category::optimizer), 0u);  // lazy: nothing before the first step
  for (auto& [n, p] : m.named_parameters()) p.set_grad(ops::ones_like(p));
  opt.step();
  *param_bytes = dev->ledger().live_bytes(Category::param);
  size_t state = dev->ledger().live_bytes(Category::optimizer);
  bool tagged = false;
  for (const engine::BlockInfo& b : dev->ledger().live_blocks()) {
    if (b.category != Category::optimizer) continue;
    EXPECT_EQ(b.phase, engine::Phase::optimizer);
    EXPECT_TRUE(b.owner == "weight/adam" || b.owner == "bias/adam") << b.owner;
    tagged = true;
  }
  EXPECT_TRUE(tagged);
  size_t grads = dev->ledger().live_bytes(Category::grad) + dev->ledger().live_bytes(Category::temp);
  opt.zero_grad();  // the gradients' blocks go back to the arena
  EXPECT_LT(dev->ledger().live_bytes(Category::grad) + dev->ledger().live_bytes(Category::temp), grads);
  for (auto& [n, p] : m.named_parameters()) EXPECT_FALSE(p.grad().defined());
  return state;
}
}  // namespace

TEST(Optim, AdamStateIsTwiceTheParameterBytesInTheLedgerOnCpuAndMeta) {
  size_t cpu_params = 0, meta_params = 0;
  size_t cpu_state = adam_state_bytes(engine::Device::create(engine::DeviceType::cpu, 1 << 24), &cpu_params);
  size_t meta_state = adam_state_bytes(engine::Device::create(engine::DeviceType::meta, 1 << 24), &meta_params);
  EXPECT_GT(cpu_params, 0u);
  EXPECT_EQ(cpu_state, 2 * cpu_params);
  EXPECT_EQ(meta_state, cpu_state);
  EXPECT_EQ(meta_params, cpu_params);
}

TEST(Optim, SgdWithoutMomentumHasNoState) {
  auto dev = engine::Device::create(engine::DeviceType::cpu, 1 << 24);
  engine::DeviceGuard guard(dev);
  Tensor p = ops::zeros({64});
  p.set_requires_grad(true);
  ops::Sgd opt({{"p", p}}, ops::SgdOptions{0.1});
  p.set_grad(ops::ones_like(p));
  opt.step();
  EXPECT_EQ(dev->ledger().live_bytes(Category::optimizer), 0u);
  EXPECT_EQ(p.to_double()[0], double(-0.1f));
}

// ---------------------------------------------------------------------------------------------------
// Adafactor against torch.optim.Adafactor (tests/data/optim/adafactor_reference.py prints these values), and the
// state every optimizer keeps against its formula.

namespace {
// The reference script's inputs: parameter k of `shape`, its gradient at step s.
Vec adafactor_init(int64_t n, int k) {
  Vec v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) v[size_t(i)] = std::fmod(double(i + 1) * 0.37 * double(k + 1), 1.0) - 0.5;
  return v;
}
Vec adafactor_grad(int64_t n, int k, int s) {
  Vec g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) g[size_t(i)] = std::sin(0.7 * double(i) + s + k);
  return g;
}
}  // namespace

TEST(Optim, AdafactorMatchesPyTorch) {
  const std::vector<Shape> shapes = {{3, 4}, {2, 3, 2}, {5}};
  const std::vector<Vec> want = {
      {-0.14390629582121908, 0.23416721716714906, -0.38196002661469514, -0.0049734113230754133, 0.3633576855197132,
       -0.26971930495958268, 0.089377781905053022, 0.44851013012891811, -0.18359639696337257, 0.18688052468632332,
       -0.43298553331193584, -0.058008692006328251},
      {0.23636955426369829, -0.010256014102585352, -0.26368877516198885, 0.47374614238701224, 0.20490410139298118,
       -0.064061653319033615, -0.33036344301834791, 0.39862857213345687, 0.14838919089372393, -0.099296614743450695,
       -0.35221061599228687, 0.39585596029887304},
      {-0.38077424129791898, -0.26494577750006637, -0.16106270251580129, -0.058539140802354415, 0.043686549886112397}};
  // The state after the last step: row and column factors of the two factored parameters, the vector's variance.
  const std::vector<std::pair<std::string, Vec>> want_state = {
      {"p0.row_var", {0.49440813700139652, 0.49000529173643992, 0.49008875360884024}},
      {"p0.col_var", {0.51368849689812712, 0.43557723271803644, 0.46441199571658798, 0.55232518446281731}},
      {"p1.row_var",
       {0.50262141486454359, 0.51833216771423374, 0.46283262918898488, 0.55170768652987567, 0.43972709594553405,
        0.56187326694431727}},
      {"p1.col_var", {0.47984813926769837, 0.50934266857747656, 0.52153710753521665, 0.51400159207793461}},
      {"p2.variance",
       {0.57914880565565707, 0.53160066916553483, 0.43159334524794624, 0.44514556350732554, 0.54975975105992847}}};
  ops::NamedTensors params;
  for (size_t k = 0; k < shapes.size(); k++) {
    Tensor t = ops::from_vector(adafactor_init(engine::numel_of(shapes[k]), int(k)), shapes[k], DType::f64);
    t.set_requires_grad(true);
    params.emplace_back("p" + std::to_string(k), t);
  }
  ops::AdafactorOptions o;
  o.lr = 0.02;
  o.weight_decay = 0.1;
  ops::Adafactor opt(params, o);
  for (int s = 1; s <= 3; s++) {
    for (size_t k = 0; k < params.size(); k++)
      params[k].second.set_grad(
          ops::from_vector(adafactor_grad(params[k].second.numel(), int(k), s), shapes[k], DType::f64));
    opt.step();
  }
  for (size_t k = 0; k < params.size(); k++) {
    const Vec got = params[k].second.to_double();
    ASSERT_EQ(got.size(), want[k].size());
    for (size_t i = 0; i < got.size(); i++) EXPECT_NEAR(got[i], want[k][i], 1e-13) << "param " << k << " [" << i << "]";
  }
  ops::OptimizerState st = opt.state();
  ASSERT_EQ(st.tensors.size(), want_state.size());
  for (size_t j = 0; j < want_state.size(); j++) {
    EXPECT_EQ(st.tensors[j].first, want_state[j].first);
    const Vec got = st.tensors[j].second.to_double();
    ASSERT_EQ(got.size(), want_state[j].second.size()) << want_state[j].first;
    for (size_t i = 0; i < got.size(); i++) EXPECT_NEAR(got[i], want_state[j].second[i], 1e-13) << want_state[j].first;
  }
}

TEST(Optim, AdafactorRejectsBadOptionsAndLoadsItsFactoredState) {
  ops::AdafactorOptions bad;
  bad.beta2_decay = 0.5;
  Tensor p = ops::zeros({6, 4}, DType::f32).set_requires_grad(true);
  EXPECT_THROW(ops::Adafactor({{"w", p}}, bad), engine::Error);
  ops::Adafactor a({{"w", p}}, ops::AdafactorOptions{});
  p.set_grad(ops::ones_like(p));
  a.step();
  ops::OptimizerState st = a.state();
  ASSERT_EQ(st.tensors.size(), 2u);
  EXPECT_EQ(st.tensors[0].second.shape(), (Shape{6, 1}));
  EXPECT_EQ(st.tensors[1].second.shape(), (Shape{1, 4}));
  std::map<std::string, Tensor> saved(st.tensors.begin(), st.tensors.end());
  Tensor q = ops::zeros({6, 4}, DType::f32).set_requires_grad(true);
  ops::Adafactor b({{"w", q}}, ops::AdafactorOptions{});
  b.load_state(saved, st.metadata);
  EXPECT_EQ(b.step_count(), 1);
  saved["w.row_var"] = ops::zeros({6, 4}, DType::f32);  // Adam's shape, not a row factor
  ops::Adafactor c({{"w", q}}, ops::AdafactorOptions{});
  try {
    c.load_state(saved, st.metadata);
    FAIL() << "a mis-shaped factor loaded";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected f32 [6, 1]"), std::string::npos) << e.what();
  }
}

TEST(Optim, EveryOptimizerKeepsTheStateItsFormulaSaysOnCpuAndMeta) {
  // A matrix, a conv weight (factored over its last two dims by Adafactor) and a vector, in f32; every full-shape
  // slot a whole number of 256-byte arena blocks.
  const std::vector<Shape> shapes = {{64, 32}, {8, 4, 4, 4}, {64}};
  int64_t params = 0;
  for (const Shape& s : shapes) params += engine::numel_of(s);
  // Adafactor: the rows' and the columns' factors, or the whole vector, each rounded up to 64 f32 (one 256-byte
  // arena block): [64, 1] + [1, 32] -> 64 + 64; [8, 4, 4, 1] + [8, 4, 1, 4] -> 128 + 128; [64] -> 64.
  const int64_t adafactor = (64 + 64) + (128 + 128) + 64;
  const std::map<std::string, int64_t> want = {
      {"sgd", 0},          {"momentum", params},    {"adam", 2 * params}, {"adamw", 2 * params}, {"adamax", 2 * params},
      {"rmsprop", params}, {"adafactor", adafactor}};
  ASSERT_EQ(want.size(), ops::optimizer_names().size());
  for (const std::string& name : ops::optimizer_names()) {
    std::vector<size_t> bytes, peaks;
    for (auto type : {engine::DeviceType::cpu, engine::DeviceType::meta}) {
      auto dev = engine::Device::create(type, 1 << 24);
      engine::DeviceGuard guard(dev);
      ops::NamedTensors ps;
      for (size_t k = 0; k < shapes.size(); k++)
        ps.emplace_back("p" + std::to_string(k), ops::zeros(shapes[k]).set_requires_grad(true));
      auto opt = ops::make_optimizer(name, ps, 1e-3, 0.01);
      EXPECT_EQ(opt->name(), name == "momentum" ? std::string("sgd") : name);
      for (int step = 0; step < 2; step++) {
        for (auto& [n, p] : ps) p.set_grad(ops::ones_like(p));
        opt->step();
        opt->zero_grad();
      }
      bytes.push_back(dev->ledger().live_bytes(Category::optimizer));
      peaks.push_back(dev->ledger().peak_bytes());  // the update's temporaries included (Adafactor's)
    }
    EXPECT_EQ(bytes[0], size_t(4 * want.at(name))) << name;
    EXPECT_EQ(bytes[1], bytes[0]) << name << " on meta";
    EXPECT_EQ(peaks[1], peaks[0]) << name << " on meta";
  }
  EXPECT_THROW(ops::make_optimizer("lamb", {}, 1e-3, 0), engine::Error);
}

// ---------------------------------------------------------------------------------------------------
// Checkpoint of the state: save, load into a fresh optimizer, continue: bit-identical to not stopping.

namespace {
std::string temp_dir() {
  char tmpl[] = "/tmp/optim_test_XXXXXX";
  const char* d = mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? d : "/tmp";
}

void set_grads(ops::NamedTensors& params, int step) {
  for (size_t k = 0; k < params.size(); k++)
    params[k].second.set_grad(ops::from_vector(gradient(k, size_t(params[k].second.numel()), step), kShapes[k],
                                               params[k].second.dtype()));
}
}  // namespace

TEST(Optim, StateRoundTripThroughSafetensorsResumesExactly) {
  std::vector<Vec> host;
  ops::NamedTensors a = make_params(DType::f32, host);
  ops::AdamW opt_a(a, ops::AdamOptions{0.01, 0.9, 0.999, 1e-8, 0.01});
  for (int s = 0; s < 2; s++) { set_grads(a, s); opt_a.step(); }

  std::string dir = temp_dir(), path = dir + "/state.safetensors";
  ops::OptimizerState st = opt_a.state();
  EXPECT_EQ(st.tensors[0].first, "layer.weight.exp_avg");
  EXPECT_EQ(st.metadata.at("optimizer"), "adamw");
  ops::NamedTensors to_save = st.tensors;
  for (auto& [n, p] : a) to_save.emplace_back(n, p);
  engine::save_safetensors(path, to_save, st.metadata);

  // A fresh run: parameters and optimizer state from the file.
  auto loaded = engine::load_safetensors(path, engine::default_device());
  ops::NamedTensors b;
  for (const std::string& n : kNames) {
    Tensor p = loaded.at(n);
    p.set_requires_grad(true);
    b.emplace_back(n, p);
  }
  ops::AdamW opt_b(b, ops::AdamOptions{0.01, 0.9, 0.999, 1e-8, 0.01});
  opt_b.load_state(loaded, engine::read_safetensors_metadata(path));
  EXPECT_EQ(opt_b.step_count(), 2);
  EXPECT_EQ(loaded.at("layer.bias.exp_avg_sq").storage()->category(), Category::optimizer);  // adopted, retagged
  for (int s = 2; s < 5; s++) {
    set_grads(a, s);
    opt_a.step();
    set_grads(b, s);
    opt_b.step();
  }
  for (size_t k = 0; k < a.size(); k++) EXPECT_EQ(a[k].second.to_double(), b[k].second.to_double());
  std::remove(path.c_str());
  rmdir(dir.c_str());
}

TEST(Optim, LoadStateRejectsMismatches) {
  std::vector<Vec> host;
  ops::NamedTensors a = make_params(DType::f64, host);
  ops::Adam adam(a, ops::AdamOptions{});
  set_grads(a, 0);
  adam.step();
  ops::OptimizerState st = adam.state();
  std::map<std::string, Tensor> tensors(st.tensors.begin(), st.tensors.end());

  auto expect_error = [&](const std::function<void()>& f, const std::string& words) {
    try {
      f();
      ADD_FAILURE() << "expected an error containing '" << words << "'";
    } catch (const engine::Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  ops::Adamax adamax(a, ops::AdamaxOptions{});
  expect_error([&] { adamax.load_state(tensors, st.metadata); }, "saved by optimizer 'adam'");
  ops::Adam fresh(a, ops::AdamOptions{});
  auto missing = tensors;
  missing.erase("layer.bias.exp_avg_sq");
  expect_error([&] { fresh.load_state(missing, st.metadata); }, "missing state tensor 'layer.bias.exp_avg_sq'");
  auto wrong_shape = tensors;
  wrong_shape["layer.bias.exp_avg"] = ops::zeros({5}, DType::f64);
  expect_error([&] { fresh.load_state(wrong_shape, st.metadata); }, "[5]");
  auto bad_meta = st.metadata;
  bad_meta["optimizer.step"] = "x1";
  expect_error([&] { fresh.load_state(tensors, bad_meta); }, "not a non-negative integer");
  EXPECT_EQ(fresh.step_count(), 0);  // a failed load changes nothing
  fresh.load_state(tensors, st.metadata);
  EXPECT_EQ(fresh.step_count(), 1);
}

// ---------------------------------------------------------------------------------------------------
// Fused op checks, option checks

TEST(Optim, UpdateOpsCheckTheirTensors) {
  Tensor p = ops::zeros({3}, DType::f64);
  Tensor g = ops::zeros({4}, DType::f64);
  try {
    ops::adam_update({ops::ParamUpdate{p, g, {ops::zeros({3}, DType::f64), ops::zeros({3}, DType::f64)}, Tensor()}},
                     ops::AdamStep{});
    FAIL() << "expected an error";
  } catch (const engine::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("adam"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3]"), std::string::npos) << msg;
  }
  EXPECT_THROW(ops::adam_update({ops::ParamUpdate{p, ops::zeros({3}, DType::f64), {}, Tensor()}}, ops::AdamStep{}),
               engine::Error);
  EXPECT_THROW(ops::Sgd({{"p", p}}, ops::SgdOptions{0.1, 0, 0, 0, true}), engine::Error);  // nesterov, no momentum
  EXPECT_THROW(ops::Adam({{"p", p}}, ops::AdamOptions{0.1, 1.0}), engine::Error);        // beta1 = 1
}
