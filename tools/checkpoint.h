// checkpoint.h: saving a training run to one safetensors file and resuming it exactly.
//
// An engine checkpoint holds, in one file (engine/safetensors.h, written atomically):
//   tensors   the model's parameters and buffers under their dotted names (Hugging Face names for the
//             BERT family: they come from named_parameters), and the optimizer state under
//             "<param>.<slot>" (ops::Optimizer::state(): "h.0.attn.qkv.weight.exp_avg", ...)
//   metadata  the optimizer's ("optimizer", "optimizer.step", "optimizer.step.<param>"), and the run's:
//             engine.checkpoint = 1, engine.model, engine.size, engine.seq, engine.batch, engine.tokens,
//             engine.attention, engine.recompute, engine.data, engine.task, engine.seed (the command
//             line's ModelConfig), engine.step (the last step run), engine.generator.seed and
//             engine.generator.offset (engine::generator(): where dropout's random stream stands).
// Resuming is exact because nothing else carries state from one step to the next: synthetic data is a
// function of (seed, step), dropout of the generator's (seed, offset), the learning rate of the
// optimizer's step count. So steps k+1.. after a load equal an uninterrupted run's bit for bit.
//
// A file without engine metadata (a Hugging Face checkpoint) loads as weights only, through
// Model::load_weights (strict: a missing or mis-shaped tensor is an Error naming it).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "models/model.h"

namespace tools {

// Writes the model's weights, its optimizer state and the run's metadata. Refuses a model on a meta
// device (it has no values to save). Data parallel: every rank calls it (under ZeRO the optimizer state is
// assembled from the ranks' shards: Model::checkpoint_state) and rank 0 writes the file, the same as one process's.
void save_checkpoint(const std::string& path, models::Model& model, const models::ModelConfig& config,
                     int64_t step);

// Writes `dir`/model.safetensors (the weights only, under the model's parameter names, f32: the f32 master of
// a bf16/fp16 parameter; metadata format = pt, as transformers' save_pretrained writes) and `dir`/config.json
// (Model::hf_config_json), creating `dir`, so that <architecture>.from_pretrained(dir) loads it. An Error for
// a model with no transformers architecture or on the meta device.
void export_hf(const std::string& dir, models::Model& model);
// The check export_hf makes of the model, for a caller that wants to fail before a long run.
void check_hf_exportable(models::Model& model, const std::string& dir);

struct CheckpointLoad {
  bool engine_checkpoint = false;  // written by save_checkpoint; false: weights only (e.g. Hugging Face)
  bool optimizer_restored = false;
  int64_t step = 0;                // the step it was saved after (0 for weights-only files)
  size_t weights = 0;              // tensors loaded into the model
};

// Loads `path` into a model built with the checkpoint's config (fill_config_from_checkpoint). With
// `with_optimizer` false (inference), an engine checkpoint's optimizer state is not loaded. The engine's
// generator is set to the saved (seed, offset). Errors name the file.
CheckpointLoad load_checkpoint(const std::string& path, models::Model& model, bool with_optimizer = true);

// Fills the fields of `config` that the command line did not give (given(field) false; fields are named
// as engine_train's flags: model, size, seq, batch, tokens, attention, recompute, data, task, seed) from
// an engine checkpoint's metadata, so `--load FILE` alone rebuilds the saved model, and returns what it filled
// (" --size base --seq 128", for the run's header). A model name that differs from the checkpoint's is an
// Error; so is a checkpoint trained on --data when the command line gives none (a checkpoint never names the
// files a run reads). A file without engine metadata leaves `config` as it is.
std::string fill_config_from_checkpoint(const std::string& path, models::ModelConfig& config,
                                        const std::function<bool(const std::string& field)>& given);

}  // namespace tools
