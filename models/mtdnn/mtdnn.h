// mtdnn.h: MT-DNN (Liu, He, Chen and Gao 2019; namisan/mt-dnn scripts/run_mt_dnn.sh): a BERT-Large encoder
// shared by eight GLUE tasks, each with its own head, trained one task per mini-batch.
//
// Parameters carry mt-dnn's SANBertNetwork names, so an mt-dnn checkpoint loads by name:
//   bert.*                     Hugging Face BertModel names, pooler included (models/bert/encoder.h)
//   scoring_list.<i>.*         the head of the i-th trained task (the order of `tasks`):
//     pairwise classification (mnli rte qqp qnli mrpc; answer_opt 1): SanClassifier (san.h)
//     single sentence (sst cola):  a Linear [n, C] on dropout(pooled output)   scoring_list.<i>.{weight,bias}
//     regression (stsb):           a Linear [1, C] on dropout(pooled output), mean squared error
// Every head exists from the start; a step trains one task, so the other heads get no gradient that step
// and the optimizer skips them (their Adamax state appears on their first step), as in PyTorch.
//
// Tasks and sampling: `--task mnli` (or a list, `--task mnli,rte`) trains those tasks only, with only their
// heads, as mt-dnn's --train_datasets does; by default all eight. Each step's task is drawn from a host
// generator keyed by (seed, step), proportionally to the tasks' training-set sizes (GLUE's nominal sizes,
// or the rows read with --data): mt-dnn shuffles all tasks' mini-batches together, which is that
// distribution. `task_sampling = "uniform"` draws every task equally often (tests).
//
// Defaults follow mt-dnn's train.py: --size large, --seq 512 (max_seq_len), batch 8 (its --batch_size
// default; run_mt_dnn.sh passes the batch on the command line), Adamax lr 5e-5 (ops::Adamax, eps 1e-6,
// no weight decay), linear warmup over 0.1 of a nominal 5 epochs then linear decay, global grad-norm
// clip 1.0, dropout 0.1 everywhere, SAN with 5 turns and turn dropout 0.1.
// Data: synthetic seeded examples (models/data/glue.h) unless --data DIR gives GLUE's DIR/<TASK>/train.tsv
// files, tokenized with DIR/vocab.txt (WordPiece) if present, else byte by byte. Throughput is counted in
// sequences.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "models/bert/encoder.h"
#include "models/data/glue.h"
#include "models/model.h"
#include "models/mtdnn/san.h"

namespace models::mtdnn {

struct MtdnnConfig {
  bert::BertConfig bert = bert::BertConfig::large();
  std::vector<std::string> tasks;        // trained tasks, head i = tasks[i]; empty: all eight
  int64_t seq = 512, batch = 8;
  double lr = 5e-5, warmup_fraction = 0.1, clip_norm = 1.0;
  double dropout = 0.1;                  // on the pooled output (single-sentence and regression heads)
  SanOptions san;
  int64_t epochs = 5;                    // the nominal length the schedule spans ...
  int64_t total_steps = 0;               // ... unless this is set (> 0)
  std::string task_sampling = "proportional";  // proportional | uniform
  std::string data;                      // a GLUE directory; synthetic data when empty
  uint64_t seed = 1;
  // --size base|large|tiny, --seq, --batch, --attention, --recompute, --task, --data, --seed.
  static MtdnnConfig from(const ModelConfig& c);
};

// One task's head; exactly one of san and linear is set.
struct TaskHead {
  const data::GlueTask* task = nullptr;
  std::shared_ptr<SanClassifier> san;
  std::shared_ptr<nn::Linear> linear;
};

class MtdnnNet : public graph::Module {
 public:
  explicit MtdnnNet(const MtdnnConfig& c);
  // The loss of task `task` (index into heads) on a batch (keys: see Mtdnn::make_host_batch).
  Tensor loss(int64_t task, const Batch& batch) const;
  // The head's output: SAN probabilities [B, n], logits [B, n] (single sentence) or predictions [B, 1].
  Tensor forward(int64_t task, const Batch& batch) const;
  MtdnnConfig config;
  std::shared_ptr<bert::BertModel> bert;
  std::vector<TaskHead> heads;
};

class Mtdnn : public Model {
 public:
  explicit Mtdnn(const ModelConfig& c);
  explicit Mtdnn(const MtdnnConfig& c);
  graph::Module& module() override { return *net_; }
  std::string summary() const override;
  const char* item_unit() const override { return "seq"; }
  int64_t batch_size() const override { return config_.batch; }
  int64_t max_seq() const override { return config_.bert.max_positions; }
  static constexpr int64_t kMinSeq = 8;  // a pair's premise and hypothesis of a few tokens each, with 3 specials
  int64_t min_seq() const override { return kMinSeq; }
  // An MT-DNN checkpoint (it has scoring_list.* tensors) loads strictly. Otherwise it is taken as a
  // pretrained BERT, as mt-dnn's --init_checkpoint is: every encoder tensor must be there (named "bert.*",
  // as in BertForPreTraining files, or unprefixed, as in BertModel files), the heads keep their
  // initialization, and tensors outside the encoder (the pretraining heads "cls.*") are ignored.
  std::vector<std::string> load_weights(const std::map<std::string, Tensor>& tensors) override;
  MtdnnNet& net() { return *net_; }
  const MtdnnConfig& config() const { return config_; }
  // The task (index into config().tasks) that step `step` trains; a pure function of (seed, step): one Philox block
  // of counter (step, task stream) under the seed, so that probe_schedule's scans over steps cost a hash a step.
  int64_t task_of_step(int64_t step) const;
  // The optimizer steps the learning-rate schedule spans (warmup is warmup_fraction of it).
  int64_t schedule_steps() const;
  // Each task's first step, in step order (a head's Adamax state appears there, as in a real run: the other
  // steps between them allocate nothing that outlives them), then each task's next step after the last of
  // those (every head once more beside the complete state). With one task: {1, 2}. In a world (or accumulating), a
  // step's tasks are those of all its micro-batches on every rank (world_trains gives their heads state on every
  // rank), and "once more" is a step where this rank's own batch is of that task.
  std::vector<int64_t> probe_schedule() const override;
  // Data parallel: each rank's batch has its own task (the task of its data step), as each micro-batch of an
  // accumulated step has: the encoder is every rank's, a task head only the ranks of its task train. The world's
  // heads this step (the tasks of the data steps of every rank and micro-batch) get the world's mean gradient on every
  // rank, so the ranks stay identical and train as one process accumulating world x accumulation micro-batches.
  std::function<bool(const std::string&)> world_trains(int64_t step) const override;

 protected:
  // ids, token_types (i64 [B, T]), padding (bool [B, T]), labels (i64 [B]) or scores (f32 [B, 1]);
  // SAN tasks add not_premise, not_hypothesis (bool [B, T]) and, in training, turn_weights (f32 [B, K]).
  HostBatch make_host_batch(int64_t step) override;
  Tensor loss(const Batch& batch) override;
  int64_t items(const Batch& batch) const override { return batch.at("ids").size(0); }

 private:
  void build();
  MtdnnConfig config_;
  std::shared_ptr<MtdnnNet> net_;
  std::unique_ptr<data::Tokenizer> tokenizer_;  // WordPiece (DIR/vocab.txt) or bytes
  std::vector<std::vector<data::GlueExample>> examples_;  // per task, read from --data
  std::vector<int64_t> task_sizes_;                       // per task: the sampling weights (training-set rows)
  int64_t batch_task_ = 0;           // the task of the batch uploaded last (make_host_batch)
};

}  // namespace models::mtdnn
