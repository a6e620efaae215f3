// The Hugging Face layout's mapping (hf.h): config.json <-> ModelSpec for every family, the published
// tensors tiling every parameter exactly once, and the configs that are refused. The files themselves and
// the numerics against PyTorch are test/ckpt/hf_test.sh's.
#include "forge/trainer/hf.h"
#include "support/errors.h"

#include "forge/common/error.h"
#include "forge/trainer/checkpoint_io.h"
#include "forge/trainer/spec.h"

#include <catch2/catch.hpp>

#include <map>

using namespace forge::trainer;
using forge::Json;

using forge::test::error_of;
using forge::test::mentions;

namespace {

// Small models of every family, with the slots that set them apart.
std::vector<ModelSpec> family_specs() {
  const std::vector<std::vector<std::string>> keys = {
      {"--model.family=gpt2", "--model.layers=2", "--model.d_model=32", "--model.heads=4", "--model.vocab=64",
       "--model.seq_len=16", "--model.max_positions=32"},
      {"--model.family=llama", "--model.layers=2", "--model.d_model=32", "--model.heads=4",
       "--model.kv_heads=2", "--model.vocab=64", "--model.seq_len=16", "--model.max_positions=64",
       "--model.rope_scaling=llama3", "--model.rope_factor=8", "--model.rope_original_positions=32",
       "--model.ffn_hidden=96"},
      {"--model.family=qwen2", "--model.layers=2", "--model.d_model=32", "--model.heads=4",
       "--model.kv_heads=2", "--model.vocab=64", "--model.seq_len=16", "--model.tied_embeddings=on"},
      {"--model.family=qwen3", "--model.layers=2", "--model.d_model=32", "--model.heads=4",
       "--model.kv_heads=2", "--model.head_dim=16", "--model.vocab=64", "--model.seq_len=16"},
      {"--model.family=mistral", "--model.layers=2", "--model.d_model=32", "--model.heads=4",
       "--model.kv_heads=1", "--model.vocab=64", "--model.seq_len=16", "--model.window=8"},
      {"--model.family=mixtral", "--model.layers=2", "--model.d_model=32", "--model.heads=4",
       "--model.kv_heads=2", "--model.vocab=64", "--model.seq_len=16", "--model.experts=4", "--model.top_k=2",
       "--model.moe_hidden=48"},
      {"--model.family=qwen2_moe", "--model.layers=2", "--model.d_model=32", "--model.heads=4",
       "--model.kv_heads=2", "--model.vocab=64", "--model.seq_len=16", "--model.experts=4", "--model.top_k=2",
       "--model.moe_hidden=16", "--model.shared_expert_hidden=64", "--model.moe_every=2"},
  };
  std::vector<ModelSpec> out;
  for (const auto& k : keys) out.push_back(model_spec(k));
  return out;
}

Json record_without_seq_len(const ModelSpec& m) {
  Json j = model_spec_json(m);
  j.erase("seq_len");
  if (!m.dense_blocks()) j.erase("ffn_hidden");
  return j;
}

Json llama_config() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"hidden_size", 32},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"intermediate_size", 96},
          {"vocab_size", 64},
          {"max_position_embeddings", 128},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},
          {"hidden_act", "silu"}};
}

}  // namespace

TEST_CASE("hf: every family's config.json reads back as the spec it was written from", "[hf]") {
  for (const ModelSpec& m : family_specs()) {
    INFO(family_name(m.family));
    const Json config = hf_config(m, Json::object(), "bfloat16");
    CHECK(config["torch_dtype"] == "bfloat16");
    const ModelSpec back = spec_from_hf_config(config, "config.json");
    CHECK(record_without_seq_len(back) == record_without_seq_len(m));
    CHECK(back.seq_len == back.max_positions);  // a job sets its own
  }
}

TEST_CASE("hf: the published tensors tile every parameter exactly once, in their published shapes", "[hf]") {
  for (const ModelSpec& m : family_specs()) {
    INFO(family_name(m.family));
    std::map<std::string, std::vector<int>> covered;
    for (const ParamInfo& p : parameter_table(m)) covered[p.name].assign(p.numel, 0);
    for (const HfTensor& t : hf_tensors(m)) {
      INFO(t.name);
      REQUIRE(covered.count(t.param) == 1);
      int64_t published = 1, slab = 1;
      for (int64_t d : t.shape) published *= d;
      for (int64_t d : t.count) slab *= d;
      CHECK(published == slab);
      // Mark the hyperslab's elements (2-D and 3-D parameters; 1-D ones are whole).
      const auto& s = t.param_shape;
      const int64_t cols = s.back(), rows = s.size() > 1 ? s[s.size() - 2] : 1;
      const int64_t e0 = s.size() == 3 ? t.offset[0] : 0, ne = s.size() == 3 ? t.count[0] : 1;
      const int64_t r0 = s.size() > 1 ? t.offset[s.size() - 2] : 0,
                    nr = s.size() > 1 ? t.count[s.size() - 2] : 1;
      for (int64_t e = e0; e < e0 + ne; ++e)
        for (int64_t r = r0; r < r0 + nr; ++r)
          for (int64_t c = 0; c < cols; ++c) ++covered[t.param][size_t((e * rows + r) * cols + c)];
      if (t.transposed) CHECK(t.shape == std::vector<int64_t>{s[1], s[0]});
    }
    for (const auto& [name, marks] : covered) {
      INFO(name);
      CHECK(std::count(marks.begin(), marks.end(), 1) == int64_t(marks.size()));
    }
  }
}

TEST_CASE("hf: Llama, Mixtral and GPT-2 tensors carry transformers' names", "[hf]") {
  const auto specs = family_specs();
  const auto names = [](const ModelSpec& m) {
    std::map<std::string, HfTensor> out;
    for (const auto& t : hf_tensors(m)) out[t.name] = t;
    return out;
  };
  const auto gpt2 = names(specs[0]);
  REQUIRE(gpt2.count("transformer.h.1.attn.c_attn.weight"));
  CHECK(gpt2.at("transformer.h.1.attn.c_attn.weight").shape == std::vector<int64_t>{32, 96});  // [in, out]
  CHECK(gpt2.at("transformer.h.1.attn.c_attn.weight").transposed);
  CHECK(hf_canonical_name(specs[0], "h.0.ln_1.weight") == "transformer.h.0.ln_1.weight");
  const auto llama = names(specs[1]);
  const HfTensor& up = llama.at("model.layers.0.mlp.up_proj.weight");
  CHECK(up.param == "blocks.0.mlp.gate_up.weight");
  CHECK(up.offset == std::vector<int64_t>{96, 0});  // gate rows first, then up
  CHECK(llama.count("lm_head.weight") == 1);
  CHECK(names(specs[2]).count("lm_head.weight") == 0);  // qwen2 here is tied
  const auto mixtral = names(specs[5]);
  const HfTensor& w3 = mixtral.at("model.layers.1.block_sparse_moe.experts.3.w3.weight");
  CHECK(w3.param == "blocks.1.moe.gate_up.weight");
  CHECK(w3.offset == std::vector<int64_t>{3, 48, 0});
  const auto qwen_moe = names(specs[6]);
  CHECK(qwen_moe.count("model.layers.0.mlp.gate_proj.weight") == 1);  // block 0 is dense (moe_every 2)
  CHECK(qwen_moe.count("model.layers.1.mlp.shared_expert_gate.weight") == 1);
  CHECK(hf_ignored_tensor("model.layers.0.self_attn.rotary_emb.inv_freq"));
  CHECK(hf_ignored_tensor("h.3.attn.bias"));
  CHECK_FALSE(hf_ignored_tensor("transformer.h.3.attn.c_attn.bias"));
}

TEST_CASE("hf: a config that changes the math in a way forge does not compute is refused naming the key",
          "[hf]") {
  const auto refused = [](Json config, const std::string& what) {
    const forge::Error e = error_of([&] { spec_from_hf_config(config, "dir/config.json"); });
    CHECK(e.code() == forge::ExitCode::kData);
    CHECK(mentions(e, "dir/config.json"));
    CHECK(mentions(e, what));
  };
  Json c = llama_config();
  CHECK(spec_from_hf_config(c, "x").family == Family::kLlama);
  refused(Json{{"architectures", {"FalconForCausalLM"}}}, "architectures = [\"FalconForCausalLM\"]");
  c = llama_config();
  c["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  refused(c, "rope_scaling.rope_type = \"dynamic\"");
  c = llama_config();
  c["hidden_act"] = "relu";
  refused(c, "hidden_act = \"relu\"");
  c = llama_config();
  c["attention_bias"] = true;
  refused(c, "attention_bias = true");
  c = llama_config();
  c["num_attention_heads"] = 3.5;
  refused(c, "num_attention_heads = 3.5");
  c = llama_config();
  c["num_key_value_heads"] = 3;
  refused(c, "kv_heads");
  c = llama_config();
  c.erase("hidden_size");
  refused(c, "hidden_size is missing");
  c = llama_config();
  c["architectures"] = {"Qwen2ForCausalLM"};
  c["use_sliding_window"] = true;
  c["sliding_window"] = 16;
  c["max_window_layers"] = 1;
  refused(c, "max_window_layers = 1");
  c["max_window_layers"] = 2;  // no layer windowed
  CHECK(spec_from_hf_config(c, "x").window == 0);
  c["max_window_layers"] = 0;  // every layer windowed
  CHECK(spec_from_hf_config(c, "x").window == 16);
}

TEST_CASE("hf: a model whose slots its class cannot express does not leave in the layout", "[hf]") {
  ModelSpec m = family_specs()[1];
  m.linear_bias = true;  // Llama's config has no key for biases on o_proj and the MLP alike
  const forge::Error e = error_of([&] { hf_config(m, Json::object(), "float32"); });
  CHECK(e.code() == forge::ExitCode::kData);
  CHECK(mentions(e, "model.linear_bias"));
  CHECK(mentions(e, "LlamaForCausalLM"));
}

TEST_CASE("hf: an imported config's other keys survive export", "[hf]") {
  Json base = llama_config();
  base["bos_token_id"] = 128000;
  base["transformers_version"] = "4.44.0";
  const ModelSpec m = spec_from_hf_config(base, "x");
  const Json out = hf_config(m, base, "bfloat16");
  CHECK(out["bos_token_id"] == 128000);
  CHECK(out["transformers_version"] == "4.44.0");
  CHECK(out["rms_norm_eps"] == 1e-5);  // the published decimal, not the float's
  CHECK(out["torch_dtype"] == "bfloat16");
}
