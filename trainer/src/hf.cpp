#include "forge/trainer/hf.h"

#include "forge/common/error.h"
#include "forge/trainer/checkpoint_io.h"
#include "forge/trainer/spec.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <optional>

namespace forge::trainer {

namespace {

struct Architecture {
  std::string_view name;        // config.json "architectures"[0]
  std::string_view model_type;  // config.json "model_type"
  Family family;
  // transformers' defaults for keys a config may leave out
  int max_positions;
  double rope_theta;
  double norm_eps;
};

constexpr std::string_view kLlava = "LlavaForConditionalGeneration";
constexpr std::string_view kSiglipOnly =
    "the vision tower read here is SigLIP's (siglip_vision_model); CLIP's class token and quick-GELU are "
    "not supported";

constexpr Architecture kArchitectures[] = {
    {"GPT2LMHeadModel", "gpt2", Family::kGpt2, 1024, 0, 1e-5},
    {"LlamaForCausalLM", "llama", Family::kLlama, 2048, 1e4, 1e-6},
    {"Qwen2ForCausalLM", "qwen2", Family::kQwen2, 32768, 1e4, 1e-6},
    {"Qwen3ForCausalLM", "qwen3", Family::kQwen3, 32768, 1e4, 1e-6},
    {"MistralForCausalLM", "mistral", Family::kMistral, 4096 * 32, 1e4, 1e-6},
    {"MixtralForCausalLM", "mixtral", Family::kMixtral, 4096 * 32, 1e6, 1e-5},
    {"Qwen2MoeForCausalLM", "qwen2_moe", Family::kQwen2Moe, 32768, 1e4, 1e-6},
};

const Architecture& architecture_of(Family family) {
  for (const auto& a : kArchitectures)
    if (a.family == family) return a;
  return kArchitectures[0];
}

// Typed reads of config.json keys, each failure one line naming the file, the key and its value.
class Keys {
 public:
  Keys(const Json& c, const std::string& where) : c_(c), where_(where) {}

  [[noreturn]] void bad(std::string_view key, std::string_view why) const {
    fail(ExitCode::kData, "{}: {} = {}: {}", where_, key, value_text(key), why);
  }
  bool has(std::string_view key) const { return c_.contains(key) && !c_.at(std::string(key)).is_null(); }
  const Json& at(std::string_view key) const { return c_.at(std::string(key)); }
  const std::string& where() const { return where_; }

  int count(std::string_view key, std::optional<int> fallback = {}, int min = 1) const {
    if (!has(key)) {
      if (!fallback) fail(ExitCode::kData, "{}: {} is missing; a model config needs it", where_, key);
      return *fallback;
    }
    const Json& v = at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < min || v.get<int64_t>() > (1 << 30))
      bad(key, fmt::format("not an integer from {} to 2^30", min));
    return static_cast<int>(v.get<int64_t>());
  }
  double number(std::string_view key, double fallback) const {
    if (!has(key)) return fallback;
    const Json& v = at(key);
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
      bad(key, "not a finite number >= 0");
    return v.get<double>();
  }
  bool flag(std::string_view key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_boolean()) bad(key, "not true or false");
    return at(key).get<bool>();
  }
  std::string text(std::string_view key, std::string fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_string()) bad(key, "not a string");
    return at(key).get<std::string>();
  }
  // The key must be absent or have one of `allowed` values: it changes the math otherwise.
  void require(std::string_view key, const Json& allowed, std::string_view why) const {
    if (!has(key)) return;
    for (const auto& a : allowed)
      if (at(key) == a) return;
    bad(key, why);
  }

 private:
  std::string value_text(std::string_view key) const {
    return c_.contains(key) ? c_.at(std::string(key)).dump() : "(absent)";
  }
  const Json& c_;
  const std::string& where_;
};

std::string on_off(bool b) {
  return b ? "on" : "off";
}

// The rope_scaling object as model.rope_* keys.
void rope_keys(const Keys& k, std::vector<std::pair<std::string, std::string>>& out) {
  if (!k.has("rope_scaling")) return;
  const Json& r = k.at("rope_scaling");
  if (!r.is_object()) k.bad("rope_scaling", "not an object");
  const std::string where = k.where() + ": rope_scaling";
  const Keys rk(r, where);
  std::string type = rk.text("rope_type", rk.text("type", "default"));
  if (type == "default") return;
  const auto reject = [&](std::string_view why) {
    fail(ExitCode::kData, "{}: rope_scaling.rope_type = \"{}\": {}", k.where(), type, why);
  };
  if (type != "linear" && type != "llama3" && type != "yarn")
    reject(
        "this scaling is not supported (default, linear, llama3, yarn): the model's positions would be "
        "read wrongly");
  if (type == "yarn" && (rk.has("attention_factor") || rk.has("mscale") || rk.has("mscale_all_dim")))
    reject("yarn with its own attention_factor or mscale is not supported");
  out.push_back({"rope_scaling", type});
  out.push_back({"rope_factor", fmt::format("{}", rk.number("factor", 1))});
  if (type == "llama3") {
    out.push_back({"rope_low_freq_factor", fmt::format("{}", rk.number("low_freq_factor", 1))});
    out.push_back({"rope_high_freq_factor", fmt::format("{}", rk.number("high_freq_factor", 4))});
  }
  if (type == "yarn") {
    out.push_back({"rope_beta_fast", fmt::format("{}", rk.number("beta_fast", 32))});
    out.push_back({"rope_beta_slow", fmt::format("{}", rk.number("beta_slow", 1))});
  }
  if (type != "linear")
    out.push_back(
        {"rope_original_positions", std::to_string(rk.count("original_max_position_embeddings",
                                                            k.count("max_position_embeddings", 8192)))});
}

// A sliding window on every layer, or none: Qwen's max_window_layers mixes windowed and full layers.
int window_of(const Keys& k, Family family) {
  const bool qwen = family == Family::kQwen2 || family == Family::kQwen3 || family == Family::kQwen2Moe;
  if (qwen && !k.flag("use_sliding_window", false)) return 0;
  if (!k.has("sliding_window")) return 0;
  const int window = k.count("sliding_window");
  if (qwen) {
    const int layers = k.count("num_hidden_layers");
    const int full = k.count("max_window_layers", layers, 0);
    if (full >= layers) return 0;
    if (full > 0) k.bad("max_window_layers", "a sliding window on some layers only is not supported");
  }
  return window;
}

// The [model] overrides of a text model's config.json (model_spec's "--model.key=value" arguments).
std::vector<std::string> text_model_overrides(const Json& config, const std::string& where) {
  if (!config.is_object()) fail(ExitCode::kData, "{}: not a JSON object", where);
  const Keys k(config, where);
  const Architecture* arch = nullptr;
  std::string name;
  if (k.has("architectures")) {
    const Json& a = k.at("architectures");
    if (!a.is_array() || a.empty() || !a[0].is_string()) k.bad("architectures", "not a list of class names");
    name = a[0].get<std::string>();
    for (const auto& candidate : kArchitectures)
      if (candidate.name == name) arch = &candidate;
  } else {
    name = k.text("model_type", "");
    for (const auto& candidate : kArchitectures)
      if (candidate.model_type == name) arch = &candidate;
  }
  if (!arch) {
    std::string known;
    for (const auto& a : kArchitectures) known += (known.empty() ? "" : ", ") + std::string(a.name);
    k.bad(k.has("architectures") ? "architectures" : "model_type",
          fmt::format("not a supported architecture ({})", known));
  }
  const Family family = arch->family;
  std::vector<std::pair<std::string, std::string>> keys = {{"family", std::string(family_name(family))}};
  const auto set = [&](std::string key, auto value) {
    keys.push_back({std::move(key), fmt::format("{}", value)});
  };

  if (family == Family::kGpt2) {
    const int d = k.count("n_embd", 768), positions = k.count("n_positions", 1024);
    set("layers", k.count("n_layer", 12));
    set("d_model", d);
    set("heads", k.count("n_head", 12));
    set("vocab", k.count("vocab_size", 50257));
    set("seq_len", positions);
    set("max_positions", positions);
    set("ffn_hidden", k.count("n_inner", 4 * d));
    if (k.number("layer_norm_epsilon", 1e-5) != 1e-5)
      k.bad("layer_norm_epsilon", "GPT-2's LayerNorm epsilon is 1e-5 here");
    k.require("activation_function", Json::array({"gelu_new", "gelu_pytorch_tanh"}),
              "GPT-2 here uses GELU's tanh form (gelu_new)");
    k.require("scale_attn_weights", Json::array({true}), "unscaled attention is not supported");
    k.require("scale_attn_by_inverse_layer_idx", Json::array({false}), "not supported");
    k.require("reorder_and_upcast_attn", Json::array({false}), "not supported");
    k.require("add_cross_attention", Json::array({false}), "cross-attention is not supported");
    k.require("tie_word_embeddings", Json::array({true}),
              "GPT2LMHeadModel's classifier is the embedding here");
  } else {
    const int d = k.count("hidden_size"), heads = k.count("num_attention_heads");
    const int positions = k.count("max_position_embeddings", arch->max_positions);
    set("layers", k.count("num_hidden_layers"));
    set("d_model", d);
    set("heads", heads);
    set("kv_heads", k.count("num_key_value_heads", heads));
    set("head_dim", k.count("head_dim", d % heads == 0 ? std::optional<int>(d / heads) : std::nullopt));
    set("vocab", k.count("vocab_size"));
    set("seq_len", positions);
    set("max_positions", positions);
    set("norm_eps", k.number("rms_norm_eps", arch->norm_eps));
    set("rope_theta", k.number("rope_theta", arch->rope_theta));
    rope_keys(k, keys);
    k.require("hidden_act", Json::array({"silu"}), "the only activation supported here is silu (SwiGLU)");
    k.require("mlp_bias", Json::array({false}), "biases on the MLP's products are not supported");
    // Qwen2 and Qwen2-MoE always have q/k/v biases; Llama's attention_bias adds them to o_proj too.
    const bool qwen2 = family == Family::kQwen2 || family == Family::kQwen2Moe;
    if (!qwen2)
      k.require("attention_bias", Json::array({false}),
                "biases on the attention's products are not supported");
    set("qkv_bias", on_off(qwen2));
    set("tied_embeddings", on_off(k.flag("tie_word_embeddings", false)));
    set("window", window_of(k, family));
    if (family == Family::kMixtral) {
      set("ffn", "moe");
      set("experts", k.count("num_local_experts", 8));
      set("top_k", k.count("num_experts_per_tok", 2));
      set("moe_hidden", k.count("intermediate_size"));
      set("ffn_hidden", k.count("intermediate_size"));
      set("router_renormalize", "on");
      if (k.number("router_jitter_noise", 0) != 0)
        k.bad("router_jitter_noise", "router noise is not supported: set it to 0");
    } else if (family == Family::kQwen2Moe) {
      set("ffn", "moe");
      set("experts", k.count("num_experts", 60));
      set("top_k", k.count("num_experts_per_tok", 4));
      set("moe_hidden", k.count("moe_intermediate_size", 1408));
      set("moe_every", k.count("decoder_sparse_step", 1));
      set("ffn_hidden", k.count("intermediate_size", 5632));
      set("router_renormalize", on_off(k.flag("norm_topk_prob", false)));
      set("shared_expert_hidden", k.count("shared_expert_intermediate_size", 5632, 0));
      if (k.has("mlp_only_layers") &&
          !(k.at("mlp_only_layers").is_array() && k.at("mlp_only_layers").empty()))
        k.bad("mlp_only_layers", "dense layers outside decoder_sparse_step are not supported");
    } else {
      set("ffn_hidden", k.count("intermediate_size"));
    }
  }
  std::vector<std::string> overrides;
  for (const auto& [key, value] : keys) overrides.push_back("--model." + key + "=" + value);
  return overrides;
}

// LlavaForConditionalGeneration: a text model (text_config) and a SigLIP vision transformer
// (vision_config) joined by a two-layer projector, the vision tower's last block feeding the projector
// (vision_feature_layer -1, every patch: "full"). The [vision] overrides of the tower and projector.
std::vector<std::string> llava_vision_overrides(const Keys& k, int d_model) {
  if (!k.has("vision_config") || !k.at("vision_config").is_object())
    k.bad("vision_config", "a LLaVA model needs its vision_config object");
  const std::string where = k.where() + ": vision_config";
  const Keys vision(k.at("vision_config"), where);
  // (LLaVA's vision_config is CLIP's when it names no model_type)
  if (vision.text("model_type", "clip_vision_model") != "siglip_vision_model")
    vision.bad("model_type", kSiglipOnly);
  const VisionSpec v = siglip_vision_spec(k.at("vision_config"), where);
  k.require("projector_hidden_act", Json::array({"gelu_pytorch_tanh"}),
            "the projector's GELU is the tanh form here (gelu_pytorch_tanh)");
  k.require("vision_feature_layer", Json::array({-1}),
            "the projector reads the tower's last block here (-1); a deeper feature layer is not supported");
  if (k.text("vision_feature_select_strategy", "default") != "full")
    k.bad("vision_feature_select_strategy", "SigLIP has no class token to drop: it must be \"full\"");
  k.require("multimodal_projector_bias", Json::array({true}), "the projector's products have biases here");
  if (k.has("image_seq_length") && k.count("image_seq_length") != v.tokens())
    k.bad("image_seq_length", fmt::format("a {0} x {0} picture in {1}-pixel patches is {2} positions",
                                          v.image_size, v.patch, v.tokens()));
  return {fmt::format("--vision.layers={}", v.layers),
          fmt::format("--vision.image_size={}", v.image_size),
          fmt::format("--vision.patch={}", v.patch),
          fmt::format("--vision.width={}", v.width),
          fmt::format("--vision.heads={}", v.heads),
          fmt::format("--vision.mlp_hidden={}", v.mlp_hidden),
          fmt::format("--vision.projector_hidden={}", d_model),
          fmt::format("--vision.norm_eps={}", v.norm_eps),
          "--vision.post_norm=off"};
}

bool is_llava(const Keys& k) {
  if (k.has("architectures") && k.at("architectures").is_array() && !k.at("architectures").empty())
    return k.at("architectures")[0] == kLlava;
  return k.text("model_type", "") == "llava";
}

}  // namespace

VisionSpec siglip_vision_spec(const Json& config, const std::string& where) {
  if (!config.is_object()) fail(ExitCode::kData, "{}: not a JSON object", where);
  const Keys v(config, where);
  v.require("model_type", Json::array({"siglip_vision_model"}), kSiglipOnly);
  v.require("hidden_act", Json::array({"gelu_pytorch_tanh"}), "SigLIP's tanh GELU is the encoder's here");
  v.require("num_channels", Json::array({3}), "the encoder takes RGB pictures");
  VisionSpec out;
  out.layers = v.count("num_hidden_layers", 12);
  out.image_size = v.count("image_size", 224);
  out.patch = v.count("patch_size", 16);
  out.width = v.count("hidden_size", 768);
  out.heads = v.count("num_attention_heads", 12);
  out.mlp_hidden = v.count("intermediate_size", 3072);
  out.norm_eps = static_cast<float>(v.number("layer_norm_eps", 1e-6));
  if (out.image_size % out.patch != 0)
    v.bad("image_size", fmt::format("not a multiple of patch_size {}", out.patch));
  if (out.width % out.heads != 0)
    v.bad("num_attention_heads", fmt::format("does not divide hidden_size {}", out.width));
  return out;
}

ModelSpec spec_from_hf_config(const Json& config, const std::string& where) {
  if (!config.is_object()) fail(ExitCode::kData, "{}: not a JSON object", where);
  const Keys k(config, where);
  std::vector<std::string> overrides;
  if (is_llava(k)) {
    if (!k.has("text_config") || !k.at("text_config").is_object())
      k.bad("text_config", "a LLaVA model needs its text_config object");
    overrides = text_model_overrides(k.at("text_config"), where + ": text_config");
    const int d_model = Keys(k.at("text_config"), where).count("hidden_size");
    const auto vision = llava_vision_overrides(k, d_model);
    overrides.insert(overrides.end(), vision.begin(), vision.end());
  } else {
    overrides = text_model_overrides(config, where);
  }
  try {
    return model_spec(overrides);
  } catch (const Error& e) {
    fail(ExitCode::kData, "{}: the model does not fit a forge model spec: {}", where, e.what());
  }
}

namespace {

// config.json of the language model alone (a text model, or a LLaVA model's text_config).
Json text_config(const ModelSpec& m, const Json& base, std::string_view torch_dtype) {
  const Architecture& arch = architecture_of(m.family);
  Json c = base.is_object() ? base : Json::object();
  c["architectures"] = {arch.name};
  c["model_type"] = arch.model_type;
  c["torch_dtype"] = torch_dtype;
  c["vocab_size"] = m.vocab;
  if (m.family == Family::kGpt2) {
    c["n_embd"] = m.d_model;
    c["n_layer"] = m.layers;
    c["n_head"] = m.heads;
    c["n_positions"] = m.max_positions;
    c["n_ctx"] = m.max_positions;
    c["n_inner"] = m.ffn_hidden;
    c["layer_norm_epsilon"] = 1e-5;
    c["activation_function"] = "gelu_new";
    c["tie_word_embeddings"] = true;
  } else {
    c["hidden_size"] = m.d_model;
    c["num_hidden_layers"] = m.layers;
    c["num_attention_heads"] = m.heads;
    c["num_key_value_heads"] = m.kv_heads;
    c["head_dim"] = m.head_dim;
    c["max_position_embeddings"] = m.max_positions;
    c["rms_norm_eps"] = std::stod(fmt::format("{}", m.norm_eps));  // 1e-06, not the float's 9.99999997e-07
    c["rope_theta"] = m.rope.theta;
    c["hidden_act"] = "silu";
    c["tie_word_embeddings"] = m.tied_embeddings;
    const char* scaling[] = {"default", "linear", "llama3", "yarn"};
    if (m.rope.scaling == RopeScaling::kNone) {
      c["rope_scaling"] = nullptr;
    } else {
      Json r = {{"rope_type", scaling[size_t(m.rope.scaling)]}, {"factor", m.rope.factor}};
      if (m.rope.scaling == RopeScaling::kLlama3)
        r.update(
            {{"low_freq_factor", m.rope.low_freq_factor}, {"high_freq_factor", m.rope.high_freq_factor}});
      if (m.rope.scaling == RopeScaling::kYarn)
        r.update({{"beta_fast", m.rope.beta_fast}, {"beta_slow", m.rope.beta_slow}});
      if (m.rope.scaling != RopeScaling::kLinear)
        r["original_max_position_embeddings"] = m.rope.original_positions;
      c["rope_scaling"] = r;
    }
    const bool qwen =
        m.family == Family::kQwen2 || m.family == Family::kQwen3 || m.family == Family::kQwen2Moe;
    if (qwen) {
      c["use_sliding_window"] = m.window > 0;
      c["sliding_window"] = m.window > 0 ? Json(m.window) : Json(nullptr);
      c["max_window_layers"] = 0;
    } else if (m.family == Family::kMistral || m.family == Family::kMixtral) {
      c["sliding_window"] = m.window > 0 ? Json(m.window) : Json(nullptr);
    }
    if (m.family != Family::kQwen2 && m.family != Family::kQwen2Moe) c["attention_bias"] = false;
    if (m.family == Family::kLlama) c["mlp_bias"] = false;
    c["intermediate_size"] = m.ffn_hidden;
    if (m.family == Family::kMixtral) {
      c["num_local_experts"] = m.experts;
      c["num_experts_per_tok"] = m.top_k;
      c["intermediate_size"] = m.moe_hidden;
      c["router_jitter_noise"] = 0.0;
    } else if (m.family == Family::kQwen2Moe) {
      c["num_experts"] = m.experts;
      c["num_experts_per_tok"] = m.top_k;
      c["moe_intermediate_size"] = m.moe_hidden;
      c["decoder_sparse_step"] = m.moe_every;
      c["norm_topk_prob"] = m.router_renormalize;
      c["shared_expert_intermediate_size"] = m.shared_expert_hidden;
      c["mlp_only_layers"] = Json::array();
    }
  }
  return c;
}

// LlavaForConditionalGeneration's config.json around the text model's: the SigLIP tower and projector.
Json llava_config(const ModelSpec& m, const Json& base, std::string_view torch_dtype) {
  Json c = base.is_object() ? base : Json::object();
  ModelSpec text = m;
  text.vision = {};
  c["text_config"] = text_config(text, c.value("text_config", Json::object()), torch_dtype);
  c["text_config"].erase("architectures");
  const VisionSpec& v = m.vision;
  Json vision = c.value("vision_config", Json::object());
  vision.update({{"model_type", "siglip_vision_model"},
                 {"hidden_size", v.width},
                 {"intermediate_size", v.mlp_hidden},
                 {"num_hidden_layers", v.layers},
                 {"num_attention_heads", v.heads},
                 {"num_channels", 3},
                 {"image_size", v.image_size},
                 {"patch_size", v.patch},
                 {"hidden_act", "gelu_pytorch_tanh"},
                 {"layer_norm_eps", std::stod(fmt::format("{}", v.norm_eps))},
                 {"vision_use_head", false}});
  c["vision_config"] = vision;
  c["architectures"] = {kLlava};
  c["model_type"] = "llava";
  c["torch_dtype"] = torch_dtype;
  c["projector_hidden_act"] = "gelu_pytorch_tanh";
  c["vision_feature_layer"] = -1;
  c["vision_feature_select_strategy"] = "full";
  c["multimodal_projector_bias"] = true;
  c["image_seq_length"] = v.tokens();
  c["tie_word_embeddings"] = m.tied_embeddings;
  return c;
}

}  // namespace

Json hf_config(const ModelSpec& m, const Json& base, std::string_view torch_dtype) {
  const bool llava = m.vision.enabled();
  if (llava && !base.contains("image_token_index"))
    fail(ExitCode::kData,
         "a vision-language model exports as {}, whose config.json names the picture placeholder's token "
         "id (image_token_index): give the tokenizer that reserves <image>",
         kLlava);
  const Json c = llava ? llava_config(m, base, torch_dtype) : text_config(m, base, torch_dtype);
  // Whatever the class cannot express shows as a difference between the spec and the config read back.
  Json want = model_spec_json(m), have = model_spec_json(spec_from_hf_config(c, "config.json"));
  for (Json* j : {&want, &have}) {
    j->erase("seq_len");
    if (!m.dense_blocks()) j->erase("ffn_hidden");  // no block has the dense FFN
  }
  const std::string_view name = llava ? kLlava : architecture_of(m.family).name;
  // (a key only one side records is the other's default)
  Json keys = want;
  keys.update(have);
  for (const auto& [key, unused] : keys.items())
    if (want.value(key, Json()) != have.value(key, Json()))
      fail(ExitCode::kData,
           "{}{} = {} has no place in {}'s config.json (it would read back as {}): this model cannot be "
           "exported in the Hugging Face layout{}",
           key.find('.') == std::string::npos ? "model." : "", key,
           want.contains(key) ? want[key].dump() : "(its default)", name,
           have.contains(key) ? have[key].dump() : "absent",
           llava ? " (LLaVA's projector reads the tower's last block, without a final norm, and is as wide "
                   "as the language model: vision.post_norm = off, vision.projector_hidden = model.d_model)"
                 : "");
  return c;
}

std::vector<HfTensor> hf_tensors(const ModelSpec& m) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const ParamInfo& p : parameter_table(m)) shapes[p.name] = p.shape;
  std::vector<HfTensor> out;
  const auto whole = [&](std::string hf, const std::string& param, bool transposed = false) {
    const auto& s = shapes.at(param);
    std::vector<int64_t> shape = s;
    if (transposed) std::swap(shape[0], shape[1]);
    out.push_back({std::move(hf), shape, param, s, std::vector<int64_t>(s.size(), 0), s, transposed});
  };
  // Rows [r0, r0 + rows) of matrix `e` of a parameter ([rows, cols] or [experts, rows, cols]).
  const auto rows = [&](std::string hf, const std::string& param, int e, int64_t r0, int64_t n) {
    const auto& s = shapes.at(param);
    if (s.size() == 3)
      out.push_back({std::move(hf), {n, s[2]}, param, s, {e, r0, 0}, {1, n, s[2]}, false});
    else if (s.size() == 2)
      out.push_back({std::move(hf), {n, s[1]}, param, s, {r0, 0}, {n, s[1]}, false});
    else
      out.push_back({std::move(hf), {n}, param, s, {r0}, {n}, false});
  };
  // LLaVA: the tower, the projector, then the language model under language_model. (the layout of
  // transformers before 4.52, which later versions still read; hf_canonical_name maps the newer one).
  const std::string lm = m.vision.enabled() ? "language_model." : "";
  if (m.vision.enabled()) {
    const VisionSpec& v = m.vision;
    const int64_t W = v.width;
    const std::string e = "vision_tower.vision_model.";
    const auto& patch = shapes.at("vision.patch.weight");  // published as the convolution's [W, 3, p, p]
    out.push_back({e + "embeddings.patch_embedding.weight",
                   {W, 3, v.patch, v.patch},
                   "vision.patch.weight",
                   patch,
                   {0, 0},
                   patch,
                   false});
    whole(e + "embeddings.patch_embedding.bias", "vision.patch.bias");
    whole(e + "embeddings.position_embedding.weight", "vision.pos.weight");
    for (int l = 0; l < v.layers; ++l) {
      const std::string b = fmt::format("vision.blocks.{}.", l),
                        h = fmt::format("{}encoder.layers.{}.", e, l);
      whole(h + "layer_norm1.weight", b + "ln1.weight");
      whole(h + "layer_norm1.bias", b + "ln1.bias");
      const char* qkv[] = {"q", "k", "v"};  // forge's qkv holds q rows, then k, then v
      for (int i = 0; i < 3; ++i) {
        rows(h + "self_attn." + qkv[i] + "_proj.weight", b + "attn.qkv.weight", 0, i * W, W);
        rows(h + "self_attn." + qkv[i] + "_proj.bias", b + "attn.qkv.bias", 0, i * W, W);
      }
      whole(h + "self_attn.out_proj.weight", b + "attn.proj.weight");
      whole(h + "self_attn.out_proj.bias", b + "attn.proj.bias");
      whole(h + "layer_norm2.weight", b + "ln2.weight");
      whole(h + "layer_norm2.bias", b + "ln2.bias");
      whole(h + "mlp.fc1.weight", b + "mlp.fc.weight");
      whole(h + "mlp.fc1.bias", b + "mlp.fc.bias");
      whole(h + "mlp.fc2.weight", b + "mlp.proj.weight");
      whole(h + "mlp.fc2.bias", b + "mlp.proj.bias");
    }
    if (v.post_norm) {  // hf_config refuses such a model; the mapping still names every parameter
      whole(e + "post_layernorm.weight", "vision.ln_post.weight");
      whole(e + "post_layernorm.bias", "vision.ln_post.bias");
    }
    for (const char* x : {"weight", "bias"}) {
      whole(std::string("multi_modal_projector.linear_1.") + x, std::string("projector.fc1.") + x);
      whole(std::string("multi_modal_projector.linear_2.") + x, std::string("projector.fc2.") + x);
    }
  }
  if (m.family == Family::kGpt2) {
    whole("transformer.wte.weight", "wte.weight");
    whole("transformer.wpe.weight", "wpe.weight");
    for (int l = 0; l < m.layers; ++l) {
      const std::string b = fmt::format("blocks.{}.", l), h = fmt::format("transformer.h.{}.", l);
      whole(h + "ln_1.weight", b + "ln1.weight");
      whole(h + "ln_1.bias", b + "ln1.bias");
      whole(h + "attn.c_attn.weight", b + "attn.qkv.weight", true);
      whole(h + "attn.c_attn.bias", b + "attn.qkv.bias");
      whole(h + "attn.c_proj.weight", b + "attn.proj.weight", true);
      whole(h + "attn.c_proj.bias", b + "attn.proj.bias");
      whole(h + "ln_2.weight", b + "ln2.weight");
      whole(h + "ln_2.bias", b + "ln2.bias");
      whole(h + "mlp.c_fc.weight", b + "mlp.fc.weight", true);
      whole(h + "mlp.c_fc.bias", b + "mlp.fc.bias");
      whole(h + "mlp.c_proj.weight", b + "mlp.proj.weight", true);
      whole(h + "mlp.c_proj.bias", b + "mlp.proj.bias");
    }
    whole("transformer.ln_f.weight", "lnf.weight");
    whole("transformer.ln_f.bias", "lnf.bias");
    return out;
  }
  // SwiGLU: forge's gate_up holds gate rows then up rows.
  const auto swiglu = [&](const std::string& hf, const std::string& param, int e, int64_t hidden,
                          const char* gate, const char* up, const char* down, const std::string& down_param) {
    rows(hf + gate + ".weight", param + "gate_up.weight", e, 0, hidden);
    rows(hf + up + ".weight", param + "gate_up.weight", e, hidden, hidden);
    rows(hf + down + ".weight", down_param, e, 0, shapes.at(down_param)[shapes.at(down_param).size() - 2]);
  };
  whole(lm + "model.embed_tokens.weight", "wte.weight");
  for (int l = 0; l < m.layers; ++l) {
    const std::string b = fmt::format("blocks.{}.", l), h = fmt::format("{}model.layers.{}.", lm, l);
    whole(h + "input_layernorm.weight", b + "ln1.weight");
    for (const char* x : {"q", "k", "v"}) {
      whole(h + "self_attn." + x + "_proj.weight", b + "attn." + x + ".weight");
      if (m.qkv_bias) whole(h + "self_attn." + x + "_proj.bias", b + "attn." + x + ".bias");
    }
    if (m.qk_norm) {
      whole(h + "self_attn.q_norm.weight", b + "attn.q_norm.weight");
      whole(h + "self_attn.k_norm.weight", b + "attn.k_norm.weight");
    }
    whole(h + "self_attn.o_proj.weight", b + "attn.proj.weight");
    whole(h + "post_attention_layernorm.weight", b + "ln2.weight");
    if (!m.moe_block(l)) {
      swiglu(h + "mlp.", b + "mlp.", 0, m.ffn_hidden, "gate_proj", "up_proj", "down_proj",
             b + "mlp.down.weight");
    } else if (m.family == Family::kMixtral) {
      whole(h + "block_sparse_moe.gate.weight", b + "moe.router.weight");
      for (int e = 0; e < m.experts; ++e)
        swiglu(fmt::format("{}block_sparse_moe.experts.{}.", h, e), b + "moe.", e, m.moe_hidden, "w1", "w3",
               "w2", b + "moe.down.weight");
    } else {
      whole(h + "mlp.gate.weight", b + "moe.router.weight");
      for (int e = 0; e < m.experts; ++e)
        swiglu(fmt::format("{}mlp.experts.{}.", h, e), b + "moe.", e, m.moe_hidden, "gate_proj", "up_proj",
               "down_proj", b + "moe.down.weight");
      if (m.shared_expert_hidden > 0) {
        swiglu(h + "mlp.shared_expert.", b + "moe.shared.", 0, m.shared_expert_hidden, "gate_proj", "up_proj",
               "down_proj", b + "moe.shared.down.weight");
        whole(h + "mlp.shared_expert_gate.weight", b + "moe.shared_gate.weight");
      }
    }
  }
  whole(lm + "model.norm.weight", "lnf.weight");
  if (!m.tied_embeddings) whole(lm + "lm_head.weight", "head.weight");
  return out;
}

std::string hf_tied_head_name(const ModelSpec& m) {
  return m.vision.enabled() ? "language_model.lm_head.weight" : "lm_head.weight";
}

bool hf_ignored_tensor(std::string_view name) {
  const auto ends = [&](std::string_view s) {
    return name.size() >= s.size() && name.substr(name.size() - s.size()) == s;
  };
  // LLaVA's SigLIP tower keeps its final norm and pooling head, which LLaVA does not use.
  const bool unused_by_llava = name.starts_with("vision_tower.vision_model.post_layernorm.") ||
                               name.starts_with("vision_tower.vision_model.head.");
  return unused_by_llava || ends(".rotary_emb.inv_freq") || ends(".attn.bias") || ends(".attn.masked_bias");
}

std::string hf_canonical_name(const ModelSpec& m, std::string_view name) {
  if (m.family == Family::kGpt2 && name.rfind("transformer.", 0) != 0 && name != "lm_head.weight")
    return "transformer." + std::string(name);
  if (m.vision.enabled()) {  // transformers >= 4.52 saves LLaVA as model.{language_model, vision_tower, ...}
    const auto moved = [&](std::string_view from, std::string_view to) -> std::optional<std::string> {
      if (!name.starts_with(from)) return std::nullopt;
      return std::string(to) + std::string(name.substr(from.size()));
    };
    for (const auto& [from, to] : {std::pair{"model.language_model.", "language_model.model."},
                                   std::pair{"model.vision_tower.", "vision_tower."},
                                   std::pair{"model.multi_modal_projector.", "multi_modal_projector."},
                                   std::pair{"lm_head.", "language_model.lm_head."}})
      if (auto n = moved(from, to)) return *n;
  }
  return std::string(name);
}

}  // namespace forge::trainer
