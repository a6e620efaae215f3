// The model in the Hugging Face layout (transformers' config.json and tensor names), for importing open
// weights and handing them back: which architectures map onto a ModelSpec, and how each published tensor
// sits in a forge parameter. The mapping of every family is tabled in docs/CHECKPOINTS.md.
#pragma once

#include "forge/ckpt/checkpoint.h"
#include "forge/common/json.h"
#include "forge/trainer/model.h"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace forge::trainer {

// The model config.json describes: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
// Qwen3ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM or GPT2LMHeadModel, with each class's defaults
// for absent keys, or LlavaForConditionalGeneration (one of those with a SigLIP vision tower whose last
// block feeds a tanh-GELU projector: a vision-language model with vision.post_norm off); seq_len =
// max_positions (a job sets its own). forge::Error(kData) naming `where`, the key and its value for another
// architecture, a key that changes the math and is not supported here (a rope_scaling type, a hidden_act,
// biases the family has no place for, a sliding window on some layers only) or a value that is not a number
// of the right kind.
ModelSpec spec_from_hf_config(const Json& config, const std::string& where);

// The encoder a SigLIP vision config describes (SiglipVisionModel's config.json, or the vision_config of
// SiglipModel or LLaVA), with SiglipVisionConfig's defaults for absent keys: its layers, picture and patch
// size, width, heads, MLP width and LayerNorm epsilon; post_norm on (SigLIP's post_layernorm) and no
// projector width. forge::Error(kData) naming `where` and the key for what the encoder does not compute
// (CLIP, another activation, other than three channels).
VisionSpec siglip_vision_spec(const Json& vision_config, const std::string& where);

// config.json for `spec`: `base` (the imported model's own config, which keeps the keys forge does not
// read, such as token ids) with every key of the math set from the spec, and torch_dtype. forge::Error
// (kData) naming the model key when the spec has something the family's class cannot express (e.g. biases
// on a Llama model's products): such a model cannot leave in this layout.
Json hf_config(const ModelSpec& spec, const Json& base, std::string_view torch_dtype);

// One published tensor and where it sits in a forge parameter: a hyperslab of the parameter's logical
// tensor whose row-major elements are the published tensor's (offset/count in the parameter's
// coordinates), or the whole parameter transposed (GPT-2's Conv1D weights are stored [in, out]).
struct HfTensor {
  std::string name;                  // e.g. "model.layers.3.mlp.gate_proj.weight"
  std::vector<int64_t> shape;        // as published
  std::string param;                 // e.g. "blocks.3.mlp.gate_up.weight"
  std::vector<int64_t> param_shape;  // the parameter's logical shape
  std::vector<int64_t> offset, count;
  bool transposed = false;
};

// Every published tensor of `spec`'s model, in the order transformers saves them.
std::vector<HfTensor> hf_tensors(const ModelSpec& spec);

// The name under which a tied model's files may also hold the classifier (a copy of the embedding).
std::string hf_tied_head_name(const ModelSpec& spec);

// Buffers some published files carry that are not parameters (rotary inv_freq tables, GPT-2's causal
// masks), and the parts of LLaVA's SigLIP tower LLaVA does not use (its final norm and pooling head): a
// reader skips them.
bool hf_ignored_tensor(std::string_view name);

// GPT-2's published files name their tensors with or without the "transformer." prefix, LLaVA's in the
// layout of transformers before 4.52 or after: the name as hf_tensors spells it.
std::string hf_canonical_name(const ModelSpec& spec, std::string_view name);

// ---- Import and export (hf_io.cpp) ----

// What an import read, for the caller's report and the registry.
struct HfImport {
  ModelSpec spec;
  std::string architecture;  // config.json's class
  std::string dtype;         // the published weights' element type: "float32", "bfloat16", "float16"
  uint64_t tensors = 0;      // published tensors read
  uint64_t bytes = 0;        // bytes of the safetensors files
  // The checkpoint's extra.origin: {"format": "hf", "source" (the directory, absolute), "architecture",
  // "model_id" and "revision" when the config or a hub cache path says, "torch_dtype", "files" {name:
  // sha256 of every file read}}.
  Json origin;
};

// Reads the Hugging Face model directory `dir` (config.json, model.safetensors or its sharded index) and
// writes a committed release-tier checkpoint at `out` of FP32 logical tensors named as forge names them,
// loadable on any layout (ckpt.init_from, a teacher, a gate baseline). The tokenizer and generation files
// (tokenizer.json, tokenizer_config.json, chat_template.jinja, tokenizer.model, special_tokens_map.json,
// generation_config.json) and config.json are kept in the checkpoint. The files are memory-mapped and read
// once, in order, converting as they go: memory holds a few MiB besides the page cache. forge::Error(kData)
// naming the file and the tensor or key for anything missing, extra, misshapen or unsupported; kUsage when
// `out` exists and is not empty unless `replace`. Nothing is left at `out` on failure.
HfImport import_hf(const std::string& dir, const std::string& out, bool replace);

struct HfExportOptions {
  std::string dtype;                     // "f32", "bf16", "f16"; "": the imported model's, else f32
  uint64_t shard_bytes = 5'000'000'000;  // tensor bytes per file; more: model-0000k-of-0000n + index
  bool replace = false;
  Json config_keys = Json::object();  // set in config.json besides the model's (e.g. bos_token_id)
  // Files to place next to the weights (tokenizer files by their Hugging Face names): name -> bytes.
  std::map<std::string, std::string> files;
};

struct HfExport {
  std::vector<std::pair<std::string, std::string>> files;  // name, sha256, as written
  uint64_t bytes = 0;
};

// Writes `checkpoint`'s model at `out` in the Hugging Face layout: config.json (hf_config over the
// imported config, if any), generation_config.json, model.safetensors or shards with
// model.safetensors.index.json, and `options.files` (an imported checkpoint's own tokenizer files unless
// given). Written in a staging directory and renamed when complete; an `out` that exists and is not empty
// is kUsage unless `replace`. A value head (PPO's critic) stays behind: the policy is what is handed back.
HfExport export_hf(const ckpt::Checkpoint& checkpoint, const std::string& out,
                   const HfExportOptions& options);

// ckpt.init_vision_from: fills the vision encoder of `model` (not its projector) from the Hugging Face
// directory `dir` of a SiglipVisionModel or a SiglipModel (its vision_model; the text model is not read),
// each process reading the pieces it holds, on any layout. The final norm is read into vision.ln_post, or
// skipped when the model's post_norm is off (LLaVA's use). forge::Error(kUsage) naming the [vision] key
// when the config describes another encoder than the model's; kData naming the file and tensor for one
// missing, extra or misshapen. Returns the record of where the weights came from: format "hf", source
// (the directory, absolute), architecture, model_id and revision when known, torch_dtype, and files
// {name: sha256}.
Json load_hf_vision_tower(const std::string& dir, GPT& model);

}  // namespace forge::trainer
