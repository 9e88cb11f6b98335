// model.h: what a trainable model gives the programs (engine_train, engine_bench) and the tests.
//
// A Model owns its Module tree, its optimizer and learning-rate schedule, and its data (synthetic, seeded,
// unless a file is given). train_step(step) is one optimizer step; the default does what a supervised
// model does (batch -> loss -> backward -> clip -> update); models with several losses per step (GANs,
// unsupervised MT) override it. Memory phases are set here, so every model's ledger reads the same way:
//   forward (the batch, tagged `input`, and the loss), backward, optimizer (clip, update, zero_grad).
// A model's constructor builds its Module tree, calls module().tag_memory() (parameters are then owned by
// their dotted names in the ledger), and creates its optimizer and schedule.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/dist.h"
#include "graph/data_parallel.h"
#include "graph/module.h"
#include "graph/parameter_shards.h"
#include "models/precision.h"
#include "ops/lr_schedule.h"
#include "ops/optimizer.h"

namespace models {

using engine::Tensor;
using Batch = std::map<std::string, Tensor>;

// Everything a command line can say about a model. 0 or "" means "the model's default".
// The dimensions of a transformer model, overriding its size's (engine_train --layers --hidden --heads --ffn --vocab
// --positions, or a Hugging Face config.json through --config: models/hf_config.h). 0 (or a negative dropout) keeps
// the size's value. A seq2seq model's `layers` is the encoder's and the decoder's.
struct TransformerDims {
  int64_t layers = 0, hidden = 0, heads = 0, ffn = 0, vocab = 0, positions = 0;
  double dropout = -1, attention_dropout = -1;  // from a config file only (hidden_dropout_prob, attn_pdrop, ...)
  bool any() const;
  // Overrides a model's dimensions with the given ones, then checks the result: every dimension positive and
  // hidden divisible by heads, an Error naming the pair and where each value came from otherwise. `model` names
  // the model in errors; attention_dropout may be null (a model with one dropout rate).
  void apply(const std::string& model, int64_t* layers, int64_t* hidden, int64_t* heads, int64_t* ffn, int64_t* vocab,
             int64_t* positions, double* dropout, double* attention_dropout) const;
};

struct ModelConfig {
  std::string name;
  std::string size;          // e.g. base | large | tiny
  int64_t seq = 0;           // sequence length
  int64_t batch = 0;         // sequences or images per step
  int64_t tokens = 0;        // tokens per step (translation models)
  std::string attention = "naive";
  std::string recompute = "none";  // none | attention | layer
  std::string precision = "fp32";  // fp32 | tf32 | bf16 | fp16 (models/precision.h)
  std::string data;          // a data file; synthetic data when empty
  std::string task;
  std::string backbone;    // a model's backbone variant (maskrcnn: r50 | r101); "" : the model's default
  TransformerDims dims;    // transformer models only (ModelEntry::dims); others refuse them
  int64_t accumulate = 1;  // micro-batches per optimizer step (Model::set_accumulation)
  int64_t generate = 0;    // decoder LMs under --inference: tokens decoded per eval step (ModelEntry::generates)
  int64_t prefill_tokens = 8192;  // prompt tokens per prefill pass when generating (0: the whole batch at once)
  int64_t r1_every = 1;           // stylegan: the R1 penalty on every k-th D step (lazy regularization; 1: v1)
  bool inference = false;  // the model will only run eval steps: bf16/fp16 keep no f32 masters (set_precision)
  std::string optimizer;   // "" : the model's recipe; else a name of ops::optimizer_names() (Model::use_optimizer)
  // Data parallel: the model is rank `rank` of a world of `world_size` (Model::set_data_parallel) with ZeRO stage
  // `zero` and gradient buckets of `bucket_mb` MiB. On the meta device create_model sets the world up itself (one
  // rank predicted, no communication: the max-batch finder's probes are ranks of that world too); ranks that
  // communicate are connected by their program (engine_train: Gloo on cpu), which calls set_data_parallel.
  int world_size = 1, rank = 0, zero = 0;
  int64_t bucket_mb = 25;
  bool bucket_view = false;  // gradients as views into the buckets (DDP's gradient_as_bucket_view)
  uint64_t seed = 1;
};

struct StepResult {
  double loss = 0;                         // the main loss (0 on meta: no values)
  bool has_loss = true;                    // false for a step that computes none (greedy generation)
  std::map<std::string, double> losses;    // every loss by name, for models with several
  int64_t items = 0;                       // sequences, images or target tokens processed
  std::vector<std::string> details;        // extra lines engine_train prints under the step line
                                           // (e.g. a decoder's key/value cache by length)
};

// The first parameter of `module` holding a non-finite value (NaN or infinity), "" when none does: for the
// report of a step whose loss was not finite. One pass over the parameters (their squared norms).
std::string first_non_finite_parameter(const graph::Module& module);

// A model's loss parts (detached scalars it kept from its last loss) into r.losses by name (0 on meta, which has no
// values), the tensors dropped and `parts` emptied; false on meta.
bool take_losses(std::map<std::string, Tensor>& parts, StepResult& r);

class Model {
 public:
  virtual ~Model() = default;
  virtual graph::Module& module() = 0;
  // One line for the program header: the architecture and its main sizes.
  virtual std::string summary() const = 0;
  // Unit of throughput: "seq", "img" or "tok".
  virtual const char* item_unit() const = 0;
  // The batch size in the unit the user gave (sequences, images, tokens), for the max-batch finder.
  virtual int64_t batch_size() const = 0;
  // Copies a checkpoint's weights into module() by name, strictly (a missing, unexpected or mis-shaped
  // tensor is an Error naming it); returns the names loaded. tools/checkpoint.* calls it for engine and
  // Hugging Face files alike. A model whose files hold tied copies or other names overrides it (BERT:
  // the tied "cls.predictions.decoder.weight", the decoder bias stored under two names).
  virtual std::vector<std::string> load_weights(const std::map<std::string, Tensor>& tensors) {
    return module().load(tensors, true);
  }

  // Hugging Face transformers export (engine_train --export-hf DIR): the config.json of the transformers
  // architecture whose state-dict names this model's parameters carry, so that DIR (that file and the weights
  // as model.safetensors) loads with <architecture>.from_pretrained(DIR); "" when there is none (the default).
  virtual std::string hf_config_json() const { return ""; }

  // The steps a max-batch probe runs, in this order (tools/max_batch.h): together they must create every
  // buffer of the steady state that the model allocates lazily (the optimizer state of every trainable
  // parameter: every task head of a multi-task model) and then run each kind of step the model has beside
  // that complete state, so that a probe's peak is the peak of any long run. The probe checks the first
  // part: a trainable parameter still without optimizer state at its end is an Error naming it.
  // Default {1, 2}: step 1 creates the optimizer state in its update, step 2 runs beside it. The token-
  // batched translation models run their longest batch at steps 1-2 and their most padded at step 3
  // (models/data/translation.h): {1, 2, 3}. MT-DNN: each task's first step, then each task once more.
  virtual std::vector<int64_t> probe_schedule() const { return {1, 2}; }
  // The steps that run one epoch of the model's data, each batch once in the order training meets them, for a
  // model whose batches differ in shape (the token-batched translation models: sentences x lengths); empty (the
  // default) when every batch has the same shapes, so that one batch's memory is every batch's. The max-batch
  // finder replays them after the probe schedule to answer for the worst batch of a data set (tools/max_batch.h).
  virtual std::vector<int64_t> epoch_steps() const { return {}; }
  // What the batch of `step` is, to name the worst one ("batch 17 of 230: 112 sentences, source 31 and target 32
  // tokens"); "" by default.
  virtual std::string describe_batch(int64_t step) const { return ""; }
  // The smallest batch the model can train on (a max-batch search starts there): 1, or 2 where batch norm in
  // training mode would see one value per channel (deeplabv3's image-pooling branch: N values per channel).
  virtual int64_t min_batch() const { return 1; }
  // The longest --seq the model can build (its learned positions, less the tokens it generates), for a model of one
  // sequence length (models/registry.h's kSeq); 0 when no table bounds it (a tiny size whose position table grows with
  // the request) or the model takes no --seq. The longest-sequence search stops there (tools/max_batch.h).
  virtual int64_t max_seq() const { return 0; }
  // The shortest --seq it can build (a sentence pair's specials, a synthetic question and answer): the search's floor.
  virtual int64_t min_seq() const { return 1; }
  // How many levels of the module path the peak-memory table groups by (Ledger::peak_table_markdown): the
  // model's repeated unit, e.g. 3 for BERT's "bert.encoder.layer.N", 1 for NASNet's cells ("cell_N").
  virtual int memory_report_depth() const { return 3; }

  virtual StepResult train_step(int64_t step);
  // Forward only, in eval mode, without recording a graph.
  virtual StepResult eval_step(int64_t step);

  ops::Optimizer& optimizer() { return *optimizer_; }
  // Replaces the recipe's optimizer by `name` (ops::make_optimizer: sgd, momentum, adam, adamw, adamax, rmsprop,
  // adafactor) with the recipe's learning rate, schedule, clipping, weight decay and its exclusions, and the new
  // optimizer's own (PyTorch's) defaults otherwise. create_model() calls it before set_precision, when
  // ModelConfig::optimizer names one; after a step it is an Error.
  void use_optimizer(const std::string& name);
  // Every optimizer the model owns (one; a GAN one per network, each over its own parameters).
  virtual std::vector<ops::Optimizer*> optimizers() { return {optimizer_.get()}; }
  // The f32 master weight of parameter `name` under mixed precision, from whichever optimizer updates it; undefined
  // when it has none (fp32, a frozen parameter, inference).
  Tensor master_weight(const std::string& name);

  // Gradient accumulation: every train_step runs `k` micro-batches of the model's batch, each a forward and a
  // backward pass from its loss / k (the gradients add up in the parameters' .grad), then one optimizer update; the
  // step's loss is the mean of the k losses and its items their sum. So the update equals one over a batch k times
  // larger whenever the loss is a mean over the batch's items (every model here but the token-batched translation
  // models, whose loss is a mean over each batch's own tokens). Micro-batch j of step s reads the data of
  // make_batch((s - 1) k + j + 1); a fixed batch (set_fixed_batch) is split into k equal slices along dimension 0.
  // Memory: from the second micro-batch on, the whole gradient set is live through forward and backward.
  void set_accumulation(int64_t k);
  int64_t accumulation() const { return accumulate_; }
  // The batches of one optimizer step over the world: world size x accumulation. Micro-batch j of step s on this
  // rank reads data step (s - 1) parts() + rank() k + j + 1 = data_step(s, j) (k: the accumulation).
  int64_t parts() const { return int64_t(world_size()) * accumulate_; }
  int64_t data_step(int64_t step, int64_t micro = 0) const {
    return (step - 1) * parts() + int64_t(rank()) * accumulate_ + micro + 1;
  }
  virtual bool supports_accumulation() const { return true; }
  // Whether train_step makes the next step's host batch ahead (make_host_batch; on by default). Off, every batch is
  // made at its step: the same values and the same allocations (tests compare the two).
  void set_prefetch(bool on) { prefetch_ = on; }
  int64_t batches_made_ahead() const { return made_ahead_; }  // the steps that used a batch made ahead so far

  // The numeric recipe (models/precision.h). create_model() calls it once, after the constructor: bf16/fp16
  // lower the parameters (f32 masters go to the optimizer), tf32 switches the GPU's f32 GEMMs to TF32.
  // For inference (keep_masters false) the parameters are lowered and their f32 copies dropped: no optimizer
  // state of any kind, as a served model has.
  void set_precision(Precision p, bool keep_masters = true);
  Precision precision() const { return precision_; }
  // The dtype of parameters and activations: models make float inputs (images, regression targets) in it.
  engine::DType compute_dtype() const { return models::compute_dtype(precision_); }
  const LossScaler& loss_scaler() const { return loss_scaler_; }
  void set_loss_scale(double scale) { loss_scaler_.scale = scale; }  // fp16: the scale of the next step

  // Every later train_step / eval_step reads this batch instead of make_batch's (engine_train --batch-file:
  // parity runs against a reference framework feed both the same tensors). Its tensors must carry the names
  // and dtypes the model's make_batch gives; a missing one is an Error naming what the batch holds. Models
  // that override train_step without calling Model::train_step refuse it (supports_fixed_batch).
  void set_fixed_batch(Batch batch);  // an empty batch, or one with an empty tensor, is an Error
  virtual bool supports_fixed_batch() const { return true; }

  // Data parallel (graph/data_parallel.h): this model becomes rank comm->rank() of comm->world_size() = W. Rank 0's
  // parameters (and f32 masters) are copied to the others now; every optimizer's gradients are averaged over the
  // ranks in buckets of `bucket_bytes` during the backward before its update; rank r > 0 draws its random numbers
  // (dropout, noise) from its own seed. Data: rank r's micro-batch j of step s reads the data of step
  // ((s - 1) W + r) k + j + 1 (k = accumulation; a fixed batch is split into W k slices, r k + j being this one's),
  // so the W ranks together read what one process reads with --accumulate W k, and its mean gradient is theirs.
  // ZeRO stage 1 or 2 shards each optimizer's state (and, at 2, the gradients) (graph/data_parallel.h): rank r
  // updates its shard and broadcasts it after every update. Stage 3 shards the parameters too
  // (graph/parameter_shards.h): only for models of one optimizer whose ranks all run the same modules.
  // Call it once, before this process's first step (after loading a checkpoint, which every rank loads alike, is
  // fine); the `single` world (one process, engine::dist::connect's for a world of one) changes nothing.
  // bucket_view: every gradient a view into its bucket (graph/data_parallel.h), no second copy of the gradients.
  void set_data_parallel(std::shared_ptr<engine::dist::Communicator> comm,
                         size_t bucket_bytes = graph::kDefaultBucketBytes, int zero_stage = 0,
                         bool bucket_view = false);
  int zero_stage() const { return zero_stage_; }
  // Why this model cannot train data parallel ("" when it can): every rank's step must run the same parameters'
  // backward through Model::backward_for, as data parallel needs (or say which parameters the world trains:
  // world_trains).
  virtual std::string why_not_data_parallel() const { return ""; }
  // A model whose ranks train different parameters in one step (MT-DNN: each rank's batch has its own task) says
  // which parameters some rank of the world trains in step `step`, the same answer on every rank (a function of the
  // data steps of all ranks); empty (the default): every rank trains the same ones. Data parallel then reduces after
  // backward and gives those parameters the world's mean gradient everywhere (graph::GradientReducer::set_uneven).
  virtual std::function<bool(const std::string&)> world_trains(int64_t step) const { return {}; }
  int rank() const { return comm_ ? comm_->rank() : 0; }
  int world_size() const { return comm_ ? comm_->world_size() : 1; }
  // The step's losses as their mean over the ranks and its items as their sum (the report's global figures); the
  // identity in a world of one.
  void average_over_ranks(StepResult& r) const;
  // Every rank's `mine` (the same length on every rank), rank after rank: W x mine.size() values (a world of one:
  // mine; meta: this rank's values for every rank, as the ranks are symmetric). And this rank's collectives so far.
  std::vector<double> gather_over_ranks(const std::vector<double>& mine) const;
  engine::dist::CommTotals communication() const;
  // `opt`'s state for a checkpoint: under ZeRO the whole state of the world, assembled from the ranks' shards (a
  // collective: every rank calls it, and every rank holds the whole when it returns), the same as plain data
  // parallel's; else opt.state(). A checkpoint of any world loads into any other (Optimizer::shard reshards it).
  ops::OptimizerState checkpoint_state(ops::Optimizer& opt) const;
  // The gradient buckets of every optimizer (empty in a world of one), for the report.
  std::vector<const graph::GradientReducer*> reducers() const;
  // ZeRO-3's shards (null below stage 3).
  const graph::ParameterShards* parameter_shards() const { return shards_.get(); }
  // Runs `fn` with every parameter whole (under ZeRO-3 they are gathered, a collective every rank calls, and released
  // after: a checkpoint reads them); else just runs it.
  void with_whole_parameters(const std::function<void()>& fn);

 protected:
  // The batch for `step` (tensors are tagged `input` by the caller). By default make_host_batch's, uploaded.
  virtual Batch make_batch(int64_t step);
  // A batch made on the host: its values are computed when it is made; calling it (once) makes its tensors on the
  // default device and sets whatever the model keeps of its batch.
  using HostBatch = std::function<Batch()>;
  // Models whose batches are host values (drawn or read from files, no device work: a pure function of the data
  // step and the configuration) make them here instead of in make_batch. train_step then makes the next step's
  // once this step's update is queued, before it waits for the loss, so that the host's work overlaps the GPU's;
  // the upload stays at the next step's start, where the ledger has always had it. Null: make_batch is overridden.
  virtual HostBatch make_host_batch(int64_t step) { return nullptr; }
  // The scalar loss of a batch, and the number of items it counts.
  virtual Tensor loss(const Batch& batch) = 0;
  virtual int64_t items(const Batch& batch) const = 0;

  // The fixed batch when one is set, else make_batch(step); and loss() with a clear error when a fixed batch
  // lacks a tensor the model reads.
  Batch next_batch(int64_t step);
  // One network's update in a step of several (a GAN's G or D, each with its own optimizer `opt` over `net`'s
  // parameters): opt's zero_grad (dropping what an earlier backward left in them), backward from `loss` (times the
  // loss scale under fp16; allocations owned by "update_<name>"), then in the optimizer phase the update, or under
  // fp16 when net's gradients overflowed the optimizer's allocate_state instead (a line in r.details), then
  // zero_grad. Returns whether the gradients were finite (always true but under fp16); the caller moves the loss
  // scale once per step (loss_scaler_.update of every update's answer).
  bool update_network(ops::Optimizer& opt, const graph::Module& net, const Tensor& loss, const std::string& name,
                      StepResult& r);
  // Micro-batch j (0-based) of step `step` on this rank: the data of its own step number (set_data_parallel), or
  // its slice of the fixed batch (the whole batch in a world of one without accumulation).
  Batch micro_batch(int64_t step, int64_t j);
  // next_batch(step) (micro >= 0: micro_batch(step, micro)) with its tensors tagged `input` and owned by "batch":
  // how every step takes its batch.
  Batch input_batch(int64_t step, int64_t micro = -1);
  Tensor batch_loss(const Batch& batch);
  // The backward pass `backward` of the last micro-batch before `opt`'s update: with data parallel, run with opt's
  // gradient buckets reduced as they complete (GradientReducer::reduce_during); else just run.
  void backward_for(const ops::Optimizer& opt, const std::function<void()>& backward);
  // opt's gradient reducer (set_data_parallel), or null in a world of one.
  graph::GradientReducer* reducer_for(const ops::Optimizer& opt) const;
  // After `opt`'s update under ZeRO: every piece of a parameter from the rank that updated it
  // (GradientReducer::broadcast_updated).
  void after_update(const ops::Optimizer& opt);
  // The L2 norm of the gradients of `params`, those `opt` updates, over the whole world: under ZeRO-2 each rank
  // holds its shard's only, so the squares of the ranks' pieces are summed (GradientReducer::global_grad_norm);
  // else ops::grad_norm.
  double grad_norm(const ops::Optimizer& opt, const std::vector<Tensor>& params) const;

  std::unique_ptr<ops::Optimizer> optimizer_;
  std::unique_ptr<ops::LrSchedule> schedule_;  // may be null: constant lr
  double clip_norm_ = 0;                       // 0: no clipping
  Precision precision_ = Precision::fp32;
  LossScaler loss_scaler_;                     // fp16 only
  Batch fixed_batch_;                          // empty: make_batch's data
  int64_t accumulate_ = 1;                     // micro-batches per step
  std::shared_ptr<engine::dist::Communicator> comm_;  // null: a world of one
  int zero_stage_ = 0;
  std::vector<std::pair<const ops::Optimizer*, std::unique_ptr<graph::GradientReducer>>> reducers_;
  std::unique_ptr<graph::ParameterShards> shards_;  // ZeRO-3 (declared after the reducers: destroyed before them)

 private:
  // The next step's host batch (make_host_batch), made by train_step; used by make_batch when its data step and the
  // module's training mode are those it was made for.
  struct Prefetched {
    int64_t step = 0;
    bool training = false;
    HostBatch batch;
  } prefetched_;
  bool prefetch_ = true;
  int64_t made_ahead_ = 0;
  void prefetch_batch(int64_t step);
};

}  // namespace models
