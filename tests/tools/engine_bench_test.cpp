// engine_bench_test.cpp: the pieces of engine_bench: the least-squares laws (they recover the coefficients
// of a synthetic ledger), ranges, the SVG plots (well-formed XML, with titles, axes and legends), the
// shared max-batch search (its answers are re-checked by independent probes), the 2020 table, and the
// program as a user runs it (errors included).
#include <gtest/gtest.h>

#include <cmath>

#include "engine/json.h"
#include "models/registry.h"
#include "tests/tools/bench_test_util.h"
#include "tools/bench_fit.h"
#include "tools/bench_lambda.h"
#include "tools/bench_scale.h"
#include "tools/svg_plot.h"

namespace {

using engine::Category;
using testutil::shell;

// A point whose ledger holds `param` bytes of parameters and `activation(x)` bytes of activations: the
// ledger is driven directly (no allocator, so no rounding), as a measured sweep would fill it.
tools::ScalePoint synthetic_point(int64_t x, double param, double act) {
  engine::Ledger l;
  l.on_alloc(0, size_t(param), size_t(param), Category::param, "w", engine::Phase::setup);
  int64_t id = l.on_alloc(size_t(param), size_t(act), size_t(act), Category::activation, "layer/softmax",
                          engine::Phase::forward);
  l.on_free(id);
  tools::ScalePoint p;
  p.x = x;
  p.fits = true;
  p.peak = l.peak_bytes();
  for (int k = 0; k < engine::kNumCategories; k++) {
    p.at_peak[size_t(k)] = l.peak_breakdown(Category(k));
    p.own_peak[size_t(k)] = l.peak_bytes(Category(k));
  }
  return p;
}

const tools::ScaleFitRow& fit_named(const tools::ScaleResult& r, const std::string& name) {
  for (const auto& f : r.fits)
    if (f.name == name) return f;
  throw std::runtime_error("no fit named " + name);
}

}  // namespace

TEST(BenchFit, RecoversKnownCoefficientsFromASyntheticLedger) {
  // activation = 3e6 + 20000 L + 96 L^2 bytes (BERT-like: 96 = 2 x 4 bytes x 12 heads); param = 5e8.
  tools::ScaleResult r;
  r.options.axis = tools::ScaleAxis::seq;
  for (int64_t L : {128, 192, 256, 384, 512, 768, 1024})
    r.points.push_back(synthetic_point(L, 5e8, 3e6 + 20000.0 * double(L) + 96.0 * double(L) * double(L)));
  r.points.push_back(synthetic_point(2048, 5e8, 1e12));
  r.points.back().fits = false;  // an out-of-memory point is left out of the fit
  tools::fit_scale(r);
  const tools::PolyFit& act = fit_named(r, "activation").fit;
  EXPECT_NEAR(act.coef[0], 3e6, 1e-3 * 3e6);
  EXPECT_NEAR(act.coef[1], 20000.0, 1e-6 * 20000);
  EXPECT_NEAR(act.coef[2], 96.0, 1e-6 * 96);
  EXPECT_LT(act.max_residual, 1.0);
  const tools::PolyFit& param = fit_named(r, "param").fit;
  EXPECT_NEAR(param.coef[0], 5e8, 1.0);
  EXPECT_NEAR(param.coef[1], 0.0, 1e-6);
  const tools::PolyFit& total = fit_named(r, "total").fit;
  EXPECT_NEAR(total.coef[0], 5e8 + 3e6, 1.0);
  EXPECT_NEAR(total.coef[2], 96.0, 1e-6 * 96);
  // The quadratic term overtakes the linear one at L = b / c.
  EXPECT_NEAR(r.crossover, 20000.0 / 96.0, 1e-3);
  // The longest sequence of each card solves a + b L + c L^2 = capacity.
  for (const auto& g : r.gpus) {
    ASSERT_GT(g.max_x, 0) << g.gpu;
    EXPECT_NEAR(total.at(g.max_x), double(g.capacity), 1e-6 * double(g.capacity)) << g.gpu;
  }
}

TEST(BenchFit, LinearLawForBatchSweepsAndEdgeCases) {
  tools::ScaleResult r;
  r.options.axis = tools::ScaleAxis::batch;
  for (int64_t B : {1, 2, 4, 8, 16}) r.points.push_back(synthetic_point(B, 1e9, 7.5e7 * double(B)));
  tools::fit_scale(r);
  const tools::PolyFit& act = fit_named(r, "activation").fit;
  EXPECT_EQ(act.degree, 1);
  EXPECT_NEAR(act.coef[1], 7.5e7, 1e-3);
  EXPECT_NEAR(act.coef[0], 0.0, 1.0);
  EXPECT_EQ(act.coef[2], 0.0);
  EXPECT_TRUE(std::isinf(r.crossover)) << "a linear law has no crossover";

  tools::PolyFit flat;
  flat.degree = 1;
  flat.coef = {100, 0, 0};
  EXPECT_TRUE(std::isinf(tools::solve_for_capacity(flat, 200)));
  EXPECT_EQ(tools::solve_for_capacity(flat, 50), -1);
  EXPECT_THROW(tools::fit_polynomial({1, 1, 1}, {1, 2, 3}, 2), engine::Error) << "needs 3 distinct x";
  EXPECT_THROW(tools::fit_polynomial({1, 2}, {1}, 1), engine::Error);

  tools::ScaleResult few;
  few.options.axis = tools::ScaleAxis::seq;
  few.points = {synthetic_point(128, 1, 2), synthetic_point(256, 1, 3)};
  try {
    tools::fit_scale(few);
    FAIL() << "two points cannot determine a quadratic law";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 3"), std::string::npos) << e.what();
  }
}

TEST(BenchScale, ParsesRangesAndRejectsBadOnes) {
  EXPECT_EQ(tools::parse_points("128:512", "seq"), (std::vector<int64_t>{128, 192, 256, 384, 512}));
  EXPECT_EQ(tools::parse_points("128:500", "seq"), (std::vector<int64_t>{128, 192, 256, 384, 500}));
  EXPECT_EQ(tools::parse_points("1:8", "batch"), (std::vector<int64_t>{1, 2, 3, 4, 6, 8}));
  EXPECT_EQ(tools::parse_points("1:64:16", "batch"), (std::vector<int64_t>{1, 17, 33, 49, 64}));
  EXPECT_EQ(tools::parse_points("8,16,64", "batch"), (std::vector<int64_t>{8, 16, 64}));
  for (const char* bad : {"512:128", "0:64", "a:b", "128", "1:2:3:4", "4,2", "1:64:0", "-4:8"}) {
    try {
      tools::parse_points(bad, "seq");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const engine::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--seq"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("expected A:B"), std::string::npos) << e.what();
    }
  }
}

TEST(BenchScale, AnalyticLawIsKorthikantisCountForTheBertFamilyOnly) {
  models::ModelConfig c;
  c.name = "bert_base";
  tools::AnalyticLaw law = tools::bert_activation_law(c, tools::ScaleAxis::seq, 32, 0);
  ASSERT_TRUE(law.present);
  EXPECT_EQ(law.c, 12.0 * 4 * 2 * 12 * 32) << "softmax output + dropped copy, 4 bytes, 12 heads, 12 layers";
  EXPECT_EQ(law.b, 12.0 * (64 * 32 * 768 + 17 * 32));
  c.attention = "flash";
  EXPECT_EQ(tools::bert_activation_law(c, tools::ScaleAxis::seq, 32, 0).c, 12.0 * 12 * 32 / 8)
      << "flash: no probabilities, only the dropout keep bits, one bit per pair";
  c.size = "tiny";  // no dropout: no keep bits
  EXPECT_EQ(tools::bert_activation_law(c, tools::ScaleAxis::seq, 32, 0).c, 0.0);
  c.size = "";
  c.name = "transformer_lm";
  EXPECT_FALSE(tools::bert_activation_law(c, tools::ScaleAxis::seq, 32, 0).present);
  c.name = "mtdnn";
  c.attention = "naive";
  c.precision = "bf16";
  EXPECT_FALSE(tools::bert_activation_law(c, tools::ScaleAxis::seq, 8, 0).present) << "restated for fp32 only";
}

// Full-size BERT-Base with flash on meta: its only L^2 term is the dropout keep bits, 1 bit per pair and layer, which
// the law states (exact at multiples of 64 keys).
TEST(BenchScale, MeasuredFlashSweepKeepsOneBitPerPair) {
  tools::ScaleOptions o;
  o.config.name = "bert_base";
  o.config.attention = "flash";
  o.config.batch = 32;
  o.points = {128, 192, 256, 384, 512};
  tools::ScaleResult r = tools::run_scale(o);
  ASSERT_TRUE(r.analytic.present);
  EXPECT_EQ(r.analytic.c, 12.0 * 12 * 32 / 8);
  EXPECT_NEAR(fit_named(r, "activation (own peak)").fit.coef[2], r.analytic.c, 0.02 * r.analytic.c);
}

TEST(BenchScale, MeasuredSweepOfTinyBertMatchesTheAnalyticQuadraticTerm) {
  tools::ScaleOptions o;
  o.config.name = "bert_base";
  o.config.size = "tiny";
  o.config.batch = 2;
  o.points = {16, 24, 32, 48, 64};
  tools::ScaleResult r = tools::run_scale(o);
  ASSERT_EQ(r.points.size(), 5u);
  for (const auto& p : r.points) EXPECT_TRUE(p.fits);
  ASSERT_TRUE(r.analytic.present);
  // The attention probabilities are the only L^2 term: the fitted c of the saved activations equals the
  // analytic one up to the allocator's 256-byte rounding.
  EXPECT_NEAR(fit_named(r, "activation (own peak)").fit.coef[2], r.analytic.c, 0.05 * r.analytic.c);
  EXPECT_GT(fit_named(r, "activation (own peak)").fit.coef[1], r.analytic.b) << "embeddings and heads add to b";
  std::string md = tools::scale_markdown(r);
  EXPECT_NE(md.find("| analytic: the layers' saved activations"), std::string::npos) << md;
  EXPECT_NE(md.find("overtakes the linear one"), std::string::npos) << md;
  for (const std::string& svg : {tools::scale_stacked_svg(r), tools::scale_fit_svg(r)}) {
    EXPECT_EQ(testutil::xml_problem(svg), "");
    EXPECT_NE(svg.find("sequence length L (tokens)"), std::string::npos);
  }
  engine::json::Value j = engine::json::parse_json(tools::scale_json(r), "scale json");
  EXPECT_EQ(j.at("points", "scale json").items.size(), 5u);
  // The same command gives the same numbers.
  EXPECT_EQ(tools::scale_csv(tools::run_scale(o)), tools::scale_csv(r));
}

TEST(SvgPlot, ChartsAreWellFormedXmlWithAxesUnitsAndLegend) {
  tools::SvgChart c;
  c.title = "memory <vs> length & more";
  c.subtitle = "batch 8";
  c.x.label = "sequence length L (tokens)";
  c.y.label = "memory (GiB)";
  c.series = {{"activation", {128, 256, 512}, {1, 2, 5}, "", false, true},
              {"param \"w\"", {128, 256, 512}, {1, 1, 1}, "", true, true}};
  c.y_marks = {{4.5, "rtx2060 arena 5.41 GiB"}};
  c.note = "total = a + b L";
  std::string line = tools::svg_chart(c);
  c.stacked = true;
  std::string stacked = tools::svg_chart(c);
  std::string grid = tools::svg_grid("two panels", {c, c}, 2);
  for (const std::string& svg : {line, stacked, grid}) {
    EXPECT_EQ(testutil::xml_problem(svg), "") << svg.substr(0, 400);
    EXPECT_NE(svg.find("memory &lt;vs&gt; length &amp; more"), std::string::npos);
    EXPECT_NE(svg.find(">sequence length L (tokens)</text>"), std::string::npos);
    EXPECT_NE(svg.find(">memory (GiB)</text>"), std::string::npos);
    EXPECT_NE(svg.find(">activation</text>"), std::string::npos) << "legend";
    EXPECT_NE(svg.find(">param &quot;w&quot;</text>"), std::string::npos) << "legend";
    EXPECT_NE(svg.find(">rtx2060 arena 5.41 GiB</text>"), std::string::npos);
    EXPECT_NE(svg.find(">400</text>"), std::string::npos) << "x ticks";
  }
  EXPECT_NE(stacked.find("<polygon"), std::string::npos);
  EXPECT_NE(line.find("stroke-dasharray"), std::string::npos);
  // The checker itself catches what it should.
  EXPECT_NE(testutil::xml_problem("<svg><g></svg>"), "");
  EXPECT_NE(testutil::xml_problem("<svg a=\"1 & 2\"/>"), "");
  EXPECT_NE(testutil::xml_problem("<svg/><svg/>"), "");
  // And python's parser agrees, where python3 exists.
  if (testutil::have_python3()) {
    testutil::TempDir dir;
    testutil::write_text(dir.file("a.svg"), grid);
    auto [code, out] = testutil::python(dir, "import sys, xml.etree.ElementTree as E\n"
                                             "root = E.parse(sys.argv[1]).getroot()\n"
                                             "assert root.tag.endswith('svg'), root.tag\nprint('ok')\n",
                                        dir.file("a.svg"));
    EXPECT_EQ(code, 0) << out;
  }
  tools::SvgChart empty;
  EXPECT_THROW(tools::svg_chart(empty), engine::Error);
}

TEST(BenchLambda, AgreesWithEngineTrainForEveryModelOnTwoCards) {
  // The study's rows on its two smallest cards (the translation models' token searches are hardest there).
  testutil::TempDir dir;
  tools::Study2020 study = tools::builtin_study2020();
  std::string csv = "model,task,dataset,input,batch_unit," + study.gpus[0] + "," + study.gpus[1] +
                    ",throughput_unit,t_" + study.gpus[0] + ",t_" + study.gpus[1] + "\n";
  for (const auto& r : study.rows)
    csv += r.model + ",t,d,i," + r.batch_unit + "," + std::to_string(r.batch[0]) + "," + std::to_string(r.batch[1]) +
           "," + r.throughput_unit + ",0,0\n";
  testutil::write_text(dir.file("two_cards.csv"), csv);
  tools::LambdaOptions o;
  o.study_path = dir.file("two_cards.csv");
  o.jobs = 2;
  tools::LambdaTable t = tools::run_lambda(o);
  int compared = 0;
  for (const auto& row : t.rows) {
    if (row.model.empty()) continue;  // a study model not implemented yet
    ASSERT_EQ(row.status, "ok") << row.model;
    for (const auto& cell : row.cells) {
      std::string cmd = testutil::program("engine_train") + " --model " + row.model + " --device meta --gpu " +
                        cell.gpu + " --find-max-batch";
      if (row.config.rfind("seq ", 0) == 0) cmd += " --" + row.config;  // "seq 128" -> --seq 128
      auto [code, out] = shell(cmd);
      ASSERT_EQ(code, 0) << cmd << "\n" << out;
      const std::string verdict = cell.max_batch == 0 ? "not even a batch of " + std::to_string(cell.first_fail)
                                                      : "max batch: " + std::to_string(cell.max_batch) + " ";
      EXPECT_NE(out.find(verdict), std::string::npos) << cmd << ": engine_bench lambda says " << cell.max_batch << "\n"
                                                      << out;
      compared++;
    }
  }
  EXPECT_GE(compared, 2 * 9);
}

TEST(BenchLambda, ReadsTheStudyAndNamesBadLines) {
  testutil::TempDir dir;
  const std::string header =
      "model,task,dataset,input,batch_unit,rtx2060,rtx2070,throughput_unit,t_rtx2060,t_rtx2070\n";
  testutil::write_text(dir.file("ok.csv"),
                       "# comment\n" + header + "bert_base,lm,enwik8,seq,sequences,8,16,examples/s,34,47\n");
  tools::Study2020 s = tools::read_study2020(dir.file("ok.csv"));
  EXPECT_EQ(s.gpus, (std::vector<std::string>{"rtx2060", "rtx2070"}));
  ASSERT_NE(s.find("bert_base"), nullptr);
  EXPECT_EQ(s.find("bert_base")->batch, (std::vector<double>{8, 16}));
  EXPECT_EQ(s.find("bert_base")->throughput[1], 47);
  testutil::write_text(dir.file("bad.csv"), header + "bert_base,lm,enwik8,seq,sequences,8,x16,examples/s,34,47\n");
  try {
    tools::read_study2020(dir.file("bad.csv"));
    FAIL() << "a bad number was accepted";
  } catch (const engine::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.csv:2: column 'rtx2070'"), std::string::npos) << e.what();
  }
  // The table built into the programs is the repository's file, as it is now.
  tools::Study2020 study = tools::builtin_study2020();
  tools::Study2020 file = tools::read_study2020("tools/data/lambda2020.csv");
  EXPECT_EQ(study.gpus, file.gpus);
  ASSERT_EQ(study.rows.size(), 12u);
  ASSERT_EQ(file.rows.size(), study.rows.size());
  for (size_t i = 0; i < study.rows.size(); i++) {
    EXPECT_EQ(study.rows[i].model, file.rows[i].model);
    EXPECT_EQ(study.rows[i].batch, file.rows[i].batch);
    EXPECT_EQ(study.rows[i].throughput, file.rows[i].throughput);
  }
  // Every study model has exactly one registry name in the table.
  for (const auto& row : study.rows) {
    int mapped = 0;
    for (const auto& m : tools::study_models()) mapped += row.model == m.study;
    EXPECT_EQ(mapped, 1) << row.model;
  }
}

TEST(BenchLambda, TableOfRegisteredAndMissingModelsInTwoProcesses) {
  testutil::TempDir dir;
  testutil::write_text(dir.file("study.csv"),
                       "model,task,dataset,input,batch_unit,rtx2060,rtx2070,throughput_unit,t_rtx2060,t_rtx2070\n"
                       "mtdnn,GLUE,GLUE,seq,sequences,0,1,examples/s,0,3\n"
                       "nasnet_large,cls,ImageNet,331,images,4,8,images/s,7.3,9.2\n");
  tools::LambdaOptions o;
  o.study_path = dir.file("study.csv");
  o.jobs = 2;
  o.models = {"no_such_model"};
  EXPECT_THROW(tools::run_lambda(o), engine::Error);
  o.models = {"mtdnn", "nasnet_large"};  // registry or study names
  tools::LambdaTable t = tools::run_lambda(o);
  ASSERT_EQ(t.rows.size(), 2u);
  const tools::LambdaRow& mtdnn = t.rows[0];  // the study's order
  const tools::LambdaRow& nasnet = t.rows[1];
  EXPECT_EQ(nasnet.study, "nasnet_large");
  bool nasnet_registered = false;
  for (const auto& e : models::registry()) nasnet_registered |= e.name == "nasnet_large";
  if (!nasnet_registered) {
    EXPECT_EQ(nasnet.status, "not yet implemented");
    EXPECT_EQ(nasnet.unit, "img");
  }
  EXPECT_EQ(mtdnn.model, "mtdnn");
  EXPECT_EQ(mtdnn.status, "ok");
  EXPECT_EQ(mtdnn.config, "seq 512");
  ASSERT_EQ(mtdnn.cells.size(), 2u);
  EXPECT_EQ(mtdnn.cells[1].batch_2020, 1);
  EXPECT_EQ(mtdnn.cells[1].throughput_2020, 3);
  // Each answer, checked apart: N trains in that card's arena, N + 1 does not.
  models::ModelConfig c;
  c.name = "mtdnn";
  c.seq = 512;
  for (const auto& cell : mtdnn.cells) {
    if (cell.max_batch > 0) {
      EXPECT_TRUE(tools::probe_batch(c, engine::DeviceType::meta, cell.capacity, cell.max_batch, 2).fits);
    }
    EXPECT_FALSE(tools::probe_batch(c, engine::DeviceType::meta, cell.capacity, cell.max_batch + 1, 2).fits);
  }
  std::string md = tools::lambda_markdown(t);
  if (!nasnet_registered) {
    EXPECT_NE(md.find("| nasnet_large | img | not yet implemented | – / 4 | – / 8 |"), std::string::npos) << md;
  }
  EXPECT_NE(md.find("| mtdnn | seq | seq 512 | **" + std::to_string(mtdnn.cells[0].max_batch) + "** / 0 |"),
            std::string::npos) << md;
  std::string csv = tools::lambda_csv(t);
  EXPECT_EQ(csv.rfind("model,study_model,status,unit,config,gpu,arena_bytes,max_batch", 0), 0u) << csv;
  engine::json::Value j = engine::json::parse_json(tools::lambda_json(t), "lambda json");
  EXPECT_EQ(j.at("models", "lambda json").items.size(), t.rows.size());
  EXPECT_EQ(testutil::xml_problem(tools::lambda_svg(t)), "");
}

TEST(EngineBench, ProgramWritesItsFilesAndReportsBadInput) {
  testutil::TempDir dir;
  auto [code, out] =
      shell(testutil::program("engine_bench") +
            " scale --model transformer_lm --size tiny --seq 16:64 --batch 2 --out " + dir.path.string());
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("## Memory scaling of transformer_lm with sequence length"), std::string::npos) << out;
  // A sequence sweep gives the probed longest sequence at its batch beside the law's estimate.
  EXPECT_NE(out.find("### Longest sequence per GPU at batch 2 sequences"), std::string::npos) << out;
  EXPECT_NE(out.find("| gpu | arena | longest L (probed) | the law's estimate |"), std::string::npos) << out;
  // Files are named by the config (tiny, batch 2), so another config's sweep does not overwrite them.
  for (const char* f : {"scale_transformer_lm_seq_tiny_batch2.md", "scale_transformer_lm_seq_tiny_batch2.csv",
                        "scale_transformer_lm_seq_tiny_batch2.json", "scale_transformer_lm_seq_tiny_batch2_stacked.svg",
                        "scale_transformer_lm_seq_tiny_batch2_fit.svg"})
    EXPECT_TRUE(std::filesystem::exists(dir.file(f))) << f;
  EXPECT_EQ(testutil::xml_problem(testutil::read_text(dir.file("scale_transformer_lm_seq_tiny_batch2_stacked.svg"))),
            "");
  auto [flash_code, flash_out] = shell(testutil::program("engine_bench") +
                                       " scale --model transformer_lm --size tiny --seq 16:64 --batch 2 "
                                       "--attention flash --out " +
                                       dir.path.string());
  ASSERT_EQ(flash_code, 0) << flash_out;
  EXPECT_TRUE(std::filesystem::exists(dir.file("scale_transformer_lm_seq_tiny_flash_batch2.md")));
  EXPECT_NE(testutil::read_text(dir.file("scale_transformer_lm_seq_tiny_batch2.md")),
            testutil::read_text(dir.file("scale_transformer_lm_seq_tiny_flash_batch2.md")));
  // A batch sweep gives the probed max batch beside the law's estimate, and speaks of batches only.
  auto [batch_code, batch_out] =
      shell(testutil::program("engine_bench") + " scale --model transformer_lm --size tiny --batch 2:8 --out " +
            dir.path.string());
  ASSERT_EQ(batch_code, 0) << batch_out;
  EXPECT_NE(batch_out.find("| gpu | arena | max batch (probed) | the law's estimate |"), std::string::npos)
      << batch_out;
  EXPECT_EQ(batch_out.find("learned positions"), std::string::npos) << "a sequence-length footnote:\n" << batch_out;
  // --out that cannot be a folder stops before the sweep runs.
  testutil::write_text(dir.file("a_file"), "x");
  auto [out_code, out_text] =
      shell(testutil::program("engine_bench") + " scale --model transformer_lm --size tiny --seq 16:64 --out " +
            dir.file("a_file"));
  EXPECT_EQ(out_code, 2) << out_text;
  EXPECT_NE(out_text.find("cannot create or write this folder"), std::string::npos) << out_text;
  EXPECT_EQ(out_text.find("Memory scaling"), std::string::npos) << "the sweep ran first:\n" << out_text;

  struct Bad {
    std::string args, message;
  };
  for (const Bad& b : std::vector<Bad>{
           {"scale --model transformer_lm --seq 64:16", "--seq 64:16: the range is empty or backwards"},
           {"scale --model transformer_lm --seq 16:64 --batch 1:4", "give one range to sweep"},
           {"scale --model transformer_lm", "give a range to sweep"},
           {"scale --model no_such_model --seq 16:64", "unknown model 'no_such_model': valid models are"},
           {"scale --model bert_base --seq 128:1024", "bert_base at seq 768"},
           {"lambda --models no_such_model", "unknown model 'no_such_model'"},
           {"lambda --study /nonexistent.csv", "cannot read the 2020 study's table '/nonexistent.csv'"},
           {"frobnicate", "unknown command 'frobnicate'"},
       }) {
    auto [c2, o2] = shell(testutil::program("engine_bench") + " " + b.args + " --out " + dir.path.string());
    EXPECT_EQ(c2, 2) << b.args << "\n" << o2;
    EXPECT_NE(o2.find(b.message), std::string::npos) << b.args << "\n" << o2;
  }
}
