// The parameter table, deterministic layout-independent initialization, the optimizer pieces, gradient
// accumulation and BF16 storage.
#include "forge/common/error.h"
#include "forge/trainer/optimizer.h"
#include "support/training.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>
#include <random>

using namespace forge::trainer;
using forge::MicroBatch;
using forge::test::micro_batch;

namespace {

ModelSpec small_config() {
  return gpt2_spec(2, 32, 4, 64, 24);
}

std::vector<int32_t> random_tokens(size_t n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(n);
  for (auto& t : v) t = int32_t(rng() % uint32_t(vocab));
  return v;
}

double rel_diff(std::span<const float> a, std::span<const float> b) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / scale;
}

}  // namespace

TEST_CASE("parameter table names every tensor with its shape and shard rule", "[trainer][model]") {
  const ModelSpec cfg = small_config();
  const auto table = parameter_table(cfg);
  REQUIRE(table.size() == 2 + 12 * 2 + 2);
  CHECK(table.front().name == "wte.weight");
  CHECK(table.front().shape == std::vector<int64_t>{64, 32});
  const auto find = [&](const std::string& n) {
    for (const auto& p : table)
      if (p.name == n) return p;
    FAIL("no parameter " << n);
    return ParamInfo{};
  };
  const ParamInfo qkv = find("blocks.1.attn.qkv.weight");
  CHECK(qkv.shape == std::vector<int64_t>{96, 32});
  CHECK(qkv.shard.kind == ShardRule::Kind::kSplit);
  CHECK(qkv.shard.dim == 0);
  CHECK(qkv.shard.groups == 3);
  CHECK(find("blocks.0.attn.proj.weight").shard.dim == 1);
  CHECK(find("blocks.0.mlp.proj.bias").shard.kind == ShardRule::Kind::kReplicated);
  CHECK_FALSE(find("blocks.0.ln1.weight").decay);
  CHECK_FALSE(find("blocks.0.mlp.fc.bias").decay);
  CHECK(find("blocks.0.mlp.fc.weight").decay);
  // Contiguous, aligned, non-overlapping views.
  for (size_t i = 1; i < table.size(); ++i) {
    CHECK(table[i].offset % 16 == 0);
    CHECK(table[i].offset >= table[i - 1].offset + table[i - 1].numel);
  }

  SECTION("a tensor-parallel, pipeline-stage slice carries local shapes") {
    const auto stage = parameter_table(cfg, ModelSlice{1, 2, false, true, 1, 2});
    CHECK(stage.front().name == "wte.weight");  // the head's tied embedding
    CHECK(stage.front().local_shape == std::vector<int64_t>{32, 32});
    for (const auto& p : stage) CHECK(p.name.rfind("blocks.0.", 0) != 0);
    CHECK(stage.back().name == "lnf.bias");
  }
  SECTION("a split that does not divide is refused") {
    CHECK_THROWS_AS(parameter_table(cfg, ModelSlice{0, -1, true, true, 0, 3}), std::invalid_argument);
  }
}

TEST_CASE("initialization is deterministic and independent of the layout", "[trainer][model]") {
  const ModelSpec cfg = small_config();
  GPT a(cfg, {.batch = 1}), b(cfg, {.batch = 1});
  a.init(7);
  b.init(7);
  CHECK(std::equal(a.weights().begin(), a.weights().end(), b.weights().begin()));
  b.init(8);
  CHECK_FALSE(std::equal(a.weights().begin(), a.weights().end(), b.weights().begin()));

  const auto w = a.weight("blocks.0.mlp.fc.weight");
  const double sq = std::inner_product(w.begin(), w.end(), w.begin(), 0.0);
  CHECK(std::sqrt(sq / double(w.size())) == Approx(0.02).epsilon(0.05));
  const auto ln = a.weight("blocks.1.ln2.weight");
  CHECK(std::all_of(ln.begin(), ln.end(), [](float v) { return v == 1.0f; }));

  // Rank 1 of 2 holds rows [C/2, C) of each of q, k and v: exactly those rows of the whole tensor.
  const int C = cfg.d_model;
  const ModelSlice rank1{0, -1, true, true, 1, 2};
  const auto sliced = parameter_table(cfg, rank1);
  for (const auto& p : sliced) {
    if (p.name != "blocks.1.attn.qkv.weight") continue;
    std::vector<float> shard(p.numel);
    init_parameter(p, rank1, 7, shard);
    const auto whole = a.weight(p.name);
    for (int part = 0; part < 3; ++part)
      for (int r = 0; r < C / 2; ++r)
        for (int c = 0; c < C; ++c)
          REQUIRE(shard[(size_t(part) * C / 2 + r) * C + c] == whole[(size_t(part) * C + C / 2 + r) * C + c]);
  }
}

TEST_CASE("learning-rate schedule: linear warm-up, cosine decay to min_lr", "[trainer][optim]") {
  OptimConfig o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 4;
  CHECK(learning_rate(o, 0, 20) == Approx(0.25));
  CHECK(learning_rate(o, 3, 20) == Approx(1.0));
  CHECK(learning_rate(o, 4, 20) == Approx(1.0));
  CHECK(learning_rate(o, 12, 20) == Approx(0.55));
  CHECK(learning_rate(o, 20, 20) == Approx(0.1));
  CHECK(learning_rate(o, 50, 20) == Approx(0.1));
}

TEST_CASE("global gradient clipping scales to the norm and reports the norm before", "[trainer][optim]") {
  std::vector<float> g = {3.0f, 4.0f, 0.0f};
  CHECK(clip_grad_norm(g, 10.0) == Approx(5.0));
  CHECK(g[0] == 3.0f);
  CHECK(clip_grad_norm(g, 1.0) == Approx(5.0));
  CHECK(grad_norm(g) == Approx(1.0).epsilon(1e-5));
  CHECK(clip_grad_norm(g, 0.0) == Approx(1.0).epsilon(1e-5));  // 0: no clipping
}

TEST_CASE("AdamW decays matrices but not norms and biases", "[trainer][optim]") {
  const ModelSpec cfg = small_config();
  const auto table = parameter_table(cfg);
  const size_t n = table.back().offset + table.back().numel;
  std::vector<float> w(n, 1.0f), g(n, 0.0f);
  OptimConfig o;
  o.weight_decay = 0.5;
  AdamW opt(o, table, n);
  opt.step(w, g, 0.1);  // zero gradients: only decay moves weights
  for (const auto& p : table) {
    INFO(p.name);
    CHECK(w[p.offset] == Approx(p.decay ? 0.95 : 1.0));
  }
}

TEST_CASE("accumulating micro-batches equals one large batch", "[trainer][model]") {
  const ModelSpec cfg = small_config();
  const size_t T = size_t(cfg.seq_len);
  const auto tok = random_tokens(4 * T, cfg.vocab, 1), tgt = random_tokens(4 * T, cfg.vocab, 2);
  GPT big(cfg, {.batch = 4}), small(cfg, {.batch = 2});
  big.init(3);
  small.init(3);
  big.zero_grad();
  small.zero_grad();
  // Every micro-batch is scaled by the whole step's weight (4T scored tokens), not by its own.
  const float scale = 1.0f / float(4 * T);
  const LossSums l4 = big.forward_backward(micro_batch(tok, tgt, 4, cfg.seq_len), scale);
  const LossSums l0 = small.forward_backward(
      micro_batch(std::span(tok).first(2 * T), std::span(tgt).first(2 * T), 2, cfg.seq_len), scale);
  const LossSums l1 = small.forward_backward(
      micro_batch(std::span(tok).last(2 * T), std::span(tgt).last(2 * T), 2, cfg.seq_len), scale);
  CHECK(l4.weight == double(4 * T));
  CHECK(l0.weight + l1.weight == l4.weight);
  CHECK((l0.loss + l1.loss) == Approx(l4.loss).epsilon(1e-6));
  CHECK(rel_diff(small.grads(), big.grads()) < 1e-5);
}

TEST_CASE("the loss is weighted per token, and an ignored target counts nothing", "[trainer][loss]") {
  const ModelSpec cfg = small_config();
  const size_t T = size_t(cfg.seq_len);
  const auto tok = random_tokens(2 * T, cfg.vocab, 6), tgt = random_tokens(2 * T, cfg.vocab, 7);
  GPT m(cfg, {.batch = 2});
  m.init(5);
  MicroBatch plain = micro_batch(tok, tgt, 2, cfg.seq_len);
  std::vector<double> per_token(2 * T);
  // Each position's own loss, from a batch that scores only that position.
  const auto only = [&](size_t i, float w) {
    MicroBatch b = plain;
    b.weights.assign(b.size(), 0.0f);
    b.weights[i] = w;
    return m.forward_loss(b);
  };
  for (size_t i : {size_t(0), size_t(5), T + 3}) per_token[i] = only(i, 1.0f).loss;
  // Weights scale a position's contribution; the normaliser is their sum.
  const LossSums two = only(5, 2.0f);
  CHECK(two.loss == Approx(2 * per_token[5]).epsilon(1e-6));
  CHECK(two.weight == 2.0);
  MicroBatch mixed = plain;
  mixed.weights.assign(mixed.size(), 0.0f);
  mixed.weights[0] = 0.5f;
  mixed.weights[T + 3] = 1.5f;
  mixed.targets[5] = MicroBatch::kIgnore;  // ignored even where a weight would say otherwise
  mixed.weights[5] = 3.0f;
  const LossSums s = m.forward_loss(mixed);
  CHECK(s.weight == 2.0);
  CHECK(s.loss == Approx(0.5 * per_token[0] + 1.5 * per_token[T + 3]).epsilon(1e-6));

  SECTION("and an unscored position gets no gradient") {
    MicroBatch b = plain;
    b.weights.assign(b.size(), 1.0f);
    for (size_t i = T; i < 2 * T; ++i) b.weights[i] = 0.0f;  // row 1 unscored
    GPT a(cfg, {.batch = 2}), one(cfg, {.batch = 1});
    a.init(5);
    one.init(5);
    a.zero_grad();
    one.zero_grad();
    a.forward_backward(b, 1.0f / float(T));
    one.forward_backward(micro_batch(std::span(tok).first(T), std::span(tgt).first(T), 1, cfg.seq_len),
                         1.0f / float(T));
    CHECK(rel_diff(a.grads(), one.grads()) < 1e-5);
  }
}

TEST_CASE("packed documents do not see each other", "[trainer][model][documents]") {
  const ModelSpec cfg = small_config();  // seq_len 24
  const int T = cfg.seq_len, A = 14, Bn = T - A;
  const auto a = random_tokens(size_t(A), cfg.vocab, 8), b = random_tokens(size_t(Bn), cfg.vocab, 9),
             other = random_tokens(size_t(A), cfg.vocab, 10);
  GPT m(cfg, {.batch = 1});
  m.init(21);
  const auto logits_of = [&](const std::vector<int32_t>& first, const std::vector<int32_t>& second) {
    std::vector<int32_t> window(first);
    window.insert(window.end(), second.begin(), second.end());
    window.push_back(0);
    MicroBatch batch = forge::test::window_batch(window, 1, T);
    const int32_t start = int32_t(first.size());
    batch.set_documents(0, std::span(&start, 1));
    std::vector<float> out(size_t(T) * size_t(cfg.vocab));
    m.forward_logits(batch, out);
    return out;
  };
  // Document b after document a, and b alone at the start of a row (positions restart at b either way).
  const auto packed = logits_of(a, b), changed = logits_of(other, b);
  const auto alone = logits_of(b, other);
  const size_t V = size_t(cfg.vocab);
  const std::span<const float> b_packed(packed.data() + size_t(A) * V, size_t(Bn) * V);
  CHECK(rel_diff(std::span(changed.data() + size_t(A) * V, size_t(Bn) * V), b_packed) == 0);
  CHECK(rel_diff(std::span(alone.data(), size_t(Bn) * V), b_packed) < 1e-5);
  // And without the mask, b does see a.
  std::vector<int32_t> window(a);
  window.insert(window.end(), b.begin(), b.end());
  window.push_back(0);
  std::vector<float> unmasked(size_t(T) * V);
  m.forward_logits(forge::test::window_batch(window, 1, T), unmasked);
  CHECK(rel_diff(std::span(unmasked.data() + size_t(A) * V, size_t(Bn) * V), b_packed) > 1e-3);
}

TEST_CASE("two packed documents train as the two run alone", "[trainer][model][documents]") {
  // What packing conversations for fine-tuning relies on: with the document mask, the loss and every
  // gradient of [a | b] in one row are the sums of a alone and b alone; without it, b's part sees a.
  const ModelSpec cfg = small_config();  // seq_len 24
  const int T = cfg.seq_len, A = 10, Bn = T - A;
  const auto a = random_tokens(size_t(A) + 1, cfg.vocab, 31),
             b = random_tokens(size_t(Bn) + 1, cfg.vocab, 32), pad = random_tokens(size_t(T), cfg.vocab, 33);
  // A row of documents `docs` (each with its next token as the last target) followed by unscored padding.
  const auto run = [&](std::initializer_list<const std::vector<int32_t>*> docs, bool mask) {
    std::vector<int32_t> window;
    std::vector<int32_t> starts;
    for (const auto* d : docs) {
      if (!window.empty()) starts.push_back(int32_t(window.size()));
      window.insert(window.end(), d->begin(), d->end() - 1);
    }
    const int32_t used = int32_t(window.size());
    if (used < T) starts.push_back(used);
    window.insert(window.end(), pad.begin(), pad.begin() + (T + 1 - used));
    MicroBatch batch = forge::test::window_batch(window, 1, T);
    batch.weights.assign(size_t(T), 1.0f);
    if (mask) batch.set_documents(0, starts);
    size_t at = 0;
    for (const auto* d :
         docs) {  // each document's last target is its own next token, not the next document's
      at += d->size() - 1;
      batch.targets[at - 1] = d->back();
      batch.weights[at - 1] = 1.0f;
    }
    for (size_t i = at; i < size_t(T); ++i) batch.weights[i] = 0.0f;
    GPT m(cfg, {.batch = 1});
    m.init(21);
    m.zero_grad();
    const LossSums sums = m.forward_backward(batch, 1.0f);
    return std::pair(sums, std::vector<float>(m.grads().begin(), m.grads().end()));
  };
  const auto [packed, packed_grads] = run({&a, &b}, true);
  const auto [alone_a, grads_a] = run({&a}, true);
  const auto [alone_b, grads_b] = run({&b}, true);
  CHECK(packed.weight == double(T));
  CHECK(alone_a.weight + alone_b.weight == packed.weight);
  CHECK(packed.loss == Approx(alone_a.loss + alone_b.loss).epsilon(1e-6));
  std::vector<float> sum(grads_a.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = grads_a[i] + grads_b[i];
  CHECK(rel_diff(packed_grads, sum) < 1e-5);
  const auto [unmasked, unmasked_grads] = run({&a, &b}, false);
  CHECK(std::abs(unmasked.loss - packed.loss) > 1e-4 * packed.loss);
  CHECK(rel_diff(unmasked_grads, sum) > 1e-3);
}

TEST_CASE("a batch in next-token form trains bit for bit as its explicit targets", "[trainer][model]") {
  const ModelSpec cfg = small_config();
  const int rows = 3, T = cfg.seq_len;
  const auto windows = random_tokens(size_t(rows) * size_t(T + 1), cfg.vocab, 5);
  const MicroBatch full = forge::test::window_batch(windows, rows, T);
  MicroBatch compact;  // what the reader hands over: the windows, inputs and one next token a row
  compact.resize(rows, T, MicroBatch::Targets::kNextToken);
  for (int r = 0; r < rows; ++r)
    compact.set_window(r, windows.data() + size_t(r) * size_t(T + 1), uint64_t(r), 0);
  REQUIRE(compact.targets.empty());
  const auto train = [&](const MicroBatch& b) {
    GPT m(cfg, {.batch = rows});
    m.init(9);
    m.zero_grad();
    const LossSums sums = m.forward_backward(b, 1.0f / float(rows * T));
    return std::pair(sums.loss, std::vector<float>(m.grads().begin(), m.grads().end()));
  };
  const auto [loss_full, grads_full] = train(full);
  const auto [loss_compact, grads_compact] = train(compact);
  CHECK(loss_compact == loss_full);
  CHECK(grads_compact == grads_full);
  // A next token outside the vocabulary is the same data error as an explicit target.
  compact.next_tokens[1] = cfg.vocab;
  compact.sample_ids[1] = 41;
  GPT m(cfg, {.batch = rows});
  CHECK_THROWS_WITH(
      m.forward_backward(compact, 1.0f),
      Catch::Contains("sample 41 (row 1, position 23): target id 64 is outside the vocabulary"));
}

// Activation recompute (model.recompute): selective (the attention's output and SwiGLU's activation
// computed again in the backward) and full (each recomputed block's forward run again from its input before
// its backward) give the same loss and gradients, bit for bit, in less activation memory: with two
// micro-batches in flight (the second's forward overwrites the shared buffers before the first's backward),
// every block or every second one, for a grouped-query Llama with packed documents, a sliding-window
// Mistral, GPT-2 (GELU, LayerNorm) and a Mixtral whose experts keep theirs (selective only: full recompute
// of an MoE block is refused).
TEST_CASE("recompute trains bit for bit as keeping the activations, in less memory", "[trainer][model]") {
  using Kind = forge::trainer::Recompute::Kind;
  const std::vector<std::vector<std::string>> families = {
      {"--model.family=llama", "--model.kv_heads=2", "--model.ffn_hidden=64"},
      {"--model.family=mistral", "--model.kv_heads=2", "--model.ffn_hidden=64", "--model.window=7"},
      {"--model.family=gpt2"},
      {"--model.family=mixtral", "--model.kv_heads=2", "--model.experts=4", "--model.top_k=2",
       "--model.moe_every=2", "--model.ffn_hidden=64", "--model.moe_hidden=32"}};
  for (std::vector<std::string> args : families) {
    INFO(args[0]);
    for (const char* a : {"--model.layers=3", "--model.d_model=32", "--model.heads=4", "--model.vocab=64",
                          "--model.seq_len=24"})
      args.push_back(a);
    const ModelSpec cfg = model_spec(args);
    const int rows = 2, T = cfg.seq_len;
    std::vector<MicroBatch> batches;
    for (int i = 0; i < 2; ++i) {
      batches.push_back(
          forge::test::window_batch(random_tokens(size_t(rows) * (T + 1), cfg.vocab, 11 + i), rows, T));
      const int32_t starts[] = {5 + i, 17};
      batches.back().set_documents(0, starts);
    }
    struct Run {
      double loss[2];
      std::vector<float> grads;
      size_t activations;
    };
    const auto run = [&](Kind kind, int every) {
      GPT m(cfg, {.batch = rows, .slots = {2}, .recompute = {kind, every}});
      m.init(3);
      m.zero_grad();
      Run r;
      for (int s = 0; s < 2; ++s) r.loss[s] = m.forward(s, batches[size_t(s)], nullptr, 1.0f / 96, true).loss;
      for (int s = 0; s < 2; ++s) m.backward(s, nullptr);
      r.grads.assign(m.grads().begin(), m.grads().end());
      r.activations = m.activation_bytes();
      return r;
    };
    const Run kept = run(Kind::kNone, 1), every = run(Kind::kSelective, 1), second = run(Kind::kSelective, 2);
    CHECK(every.activations < second.activations);
    CHECK(second.activations < kept.activations);
    std::vector<Run> runs = {every, second};
    if (cfg.ffn == forge::trainer::Ffn::kMoe) {
      CHECK_THROWS_AS(run(Kind::kFull, 1), std::invalid_argument);
    } else {
      runs.push_back(run(Kind::kFull, 1));
      runs.push_back(run(Kind::kFull, 2));
      CHECK(runs[2].activations < runs[3].activations);
      CHECK(runs[3].activations < kept.activations);
      CHECK(runs[2].activations < every.activations);
    }
    for (const Run& r : runs) {
      CHECK(r.loss[0] == kept.loss[0]);
      CHECK(r.loss[1] == kept.loss[1]);
      CHECK(r.grads == kept.grads);
    }
  }
}

TEST_CASE("bad token ids are data errors, not crashes", "[trainer][model]") {
  const ModelSpec cfg = small_config();
  GPT m(cfg, {.batch = 1});
  std::vector<int32_t> tok(size_t(cfg.seq_len), 1), tgt(size_t(cfg.seq_len), 1);
  tgt[3] = cfg.vocab;
  MicroBatch bad = micro_batch(tok, tgt, 1, cfg.seq_len);
  bad.sample_ids[0] = 77;
  CHECK_THROWS_WITH(m.forward_backward(bad, 1.0f),
                    Catch::Contains("sample 77 (row 0, position 3): target id 64 is outside the vocabulary"));
  tgt[3] = 1;
  tok[5] = -2;
  CHECK_THROWS_AS(m.forward_backward(micro_batch(tok, tgt, 1, cfg.seq_len), 1.0f), forge::Error);
  CHECK_THROWS_AS(
      m.forward_backward(micro_batch(std::span(tok).first(3), std::span(tgt).first(3), 1, 3), 1.0f),
      forge::Error);
}

TEST_CASE("BF16 storage matches FP32 within BF16 tolerance", "[trainer][bf16]") {
  const ModelSpec cfg = small_config();
  const size_t n = 2 * size_t(cfg.seq_len);
  const auto tok = random_tokens(n, cfg.vocab, 4), tgt = random_tokens(n, cfg.vocab, 5);
  GPT f32(cfg, {.batch = 2}), b16(cfg, {.batch = 2, .dtype = DType::kBF16});
  f32.init(11);
  b16.init(11);
  // Master weights stay FP32; the working copy is BF16.
  CHECK(std::equal(f32.weights().begin(), f32.weights().end(), b16.weights().begin()));
  f32.zero_grad();
  b16.zero_grad();
  const MicroBatch batch = micro_batch(tok, tgt, 2, cfg.seq_len);
  const double lf = f32.forward_backward(batch, 1.0f / float(n)).loss / double(n);
  const double lb = b16.forward_backward(batch, 1.0f / float(n)).loss / double(n);
  CHECK(lf != lb);  // BF16 rounding did happen
  // BF16 keeps 8 significant bits (relative step 2^-8 = 0.4%); losses agree far closer as errors average.
  CHECK(std::abs(lf - lb) / lf < 4e-3);
  for (const auto& p : f32.params()) {
    INFO(p.name);
    CHECK(rel_diff(b16.grad(p.name), f32.grad(p.name)) < 5e-2);
  }

  SECTION("and keeps the matrix products' saved inputs in 2 bytes a value") {
    // Per token and layer: ln1, ln2 (C), qkv (3C), att (C), fc_pre, fc_act (4C) = 14 C values, kept for
    // every layer in FP32 mode and as BF16 in BF16 mode, with no FP32 copy of any of them.
    ModelSpec deep = cfg;
    deep.layers = 6;
    GPT f(deep, {.batch = 2}), b(deep, {.batch = 2, .dtype = DType::kBF16});
    const size_t saved = 14 * size_t(deep.d_model) * 2 * size_t(deep.seq_len);
    CHECK(f.activation_bytes() - b.activation_bytes() == saved * (4 - 2) * 6);
  }

  SECTION("and trains like FP32") {
    TrainSpec s;
    s.model = cfg;
    s.batch = 2;
    s.steps = 20;
    s.threads = 1;
    s.optim.lr = 3e-3;
    TrainSpec sb = s;
    sb.dtype = DType::kBF16;
    forge::test::OneProcess a(s), b(sb);
    std::vector<int32_t> rows(size_t(s.batch) * size_t(cfg.seq_len + 1));
    for (int step = 0; step < 20; ++step) {
      for (size_t i = 0; i < rows.size(); ++i) rows[i] = int32_t((i * 7 + size_t(step)) % 13);
      const MicroBatch mb = forge::test::window_batch(rows, s.batch, cfg.seq_len);
      const double la = a->step({&mb, 1}).loss, lb2 = b->step({&mb, 1}).loss;
      CHECK(std::abs(la - lb2) / la < 2e-2);
    }
  }
}
