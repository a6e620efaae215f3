// Each fast kernel against a plain double-precision reference at shapes that cross the kernels' internal
// blocks (attention row blocks of 64, classifier chunks of 256 rows).
#include "cpu/kernels.h"
#include "forge/common/batch.h"
#include "forge/trainer/context_parallel.h"
#include "forge/trainer/layers.h"
#include "forge/trainer/model.h"
#include "support/numerics.h"

#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace k = forge::trainer::cpu;

using forge::test::max_rel;
using forge::test::randn;

namespace {

// Naive causal grouped-query attention on qkv rows [B*T, shape.qkv_width()] (q | k | v heads, query head
// h reading key/value head h / (heads / kv_heads)), the query at row position t seeing keys
// [first[b*T + t], t] (first empty: [0, t]), the last shape.window of them when window > 0; every key
// [0, T) when not shape.causal. Returns out [B*T, q_width] and, given dout, dqkv.
void reference_attention(const std::vector<float>& qkv, const std::vector<float>& dout,
                         const std::vector<int32_t>& first, int B, int T,
                         const forge::trainer::AttentionShape& shape, std::vector<double>& out,
                         std::vector<double>& dqkv) {
  const int hd = shape.head_dim, W = shape.qkv_width(), QW = shape.q_width(), KW = shape.kv_width();
  const int group = shape.heads / shape.kv_heads;
  const double scale = 1.0 / std::sqrt(double(hd));
  out.assign(size_t(B) * T * QW, 0.0);
  dqkv.assign(size_t(B) * T * W, 0.0);
  std::vector<double> p(T), dp(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < shape.heads; ++h)
      for (int t = 0; t < T; ++t) {
        const size_t qc = size_t(h) * hd, kc = size_t(QW) + size_t(h / group) * hd, vc = kc + KW;
        const auto at = [&](int i, size_t col) { return (size_t(b) * T + i) * W + col; };
        const auto Q = [&](int i, int c) { return double(qkv[at(i, qc + c)]); };
        const auto K = [&](int i, int c) { return double(qkv[at(i, kc + c)]); };
        const auto Vv = [&](int i, int c) { return double(qkv[at(i, vc + c)]); };
        int j0 = first.empty() || !shape.causal ? 0 : first[size_t(b) * T + t];
        if (shape.window > 0 && shape.causal) j0 = std::max(j0, t - shape.window + 1);
        const int last = shape.causal ? t : T - 1;
        double mx = -1e300;
        for (int j = j0; j <= last; ++j) {
          double s = 0;
          for (int c = 0; c < hd; ++c) s += Q(t, c) * K(j, c);
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int j = j0; j <= last; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int j = j0; j <= last; ++j) p[j] /= sum;
        const float* g = dout.data() + (size_t(b) * T + t) * QW + qc;
        double* o = out.data() + (size_t(b) * T + t) * QW + qc;
        for (int c = 0; c < hd; ++c)
          for (int j = j0; j <= last; ++j) o[c] += p[j] * Vv(j, c);
        // backward of row t
        double dot = 0;
        for (int j = j0; j <= last; ++j) {
          dp[j] = 0;
          for (int c = 0; c < hd; ++c) dp[j] += g[c] * Vv(j, c);
          dot += p[j] * dp[j];
        }
        for (int j = j0; j <= last; ++j) {
          const double ds = p[j] * (dp[j] - dot) * scale;
          for (int c = 0; c < hd; ++c) {
            dqkv[at(t, qc + c)] += ds * K(j, c);
            dqkv[at(j, kc + c)] += ds * Q(t, c);
            dqkv[at(j, vc + c)] += p[j] * g[c];
          }
        }
      }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Packed documents of batch row 0 with boundaries inside and across the 64-row blocks; row 1 is one document.
std::vector<int32_t> packed_documents(int B, int T) {
  std::vector<int32_t> first(size_t(B) * T, 0);
  for (int t = 0, start = 0; t < T; ++t) {
    if (t == 5 || t == 63 || t == 64 || t == 100) start = t;
    first[size_t(t)] = start;
  }
  return first;
}

}  // namespace

TEST_CASE("attention matches the naive reference across row blocks", "[trainer][kernels]") {
  using forge::trainer::AttentionShape;
  struct Case {
    AttentionShape shape;
    int T;
  };
  // Multi-head (C 32, 4 heads), grouped-query (2 and 1 key/value heads), head_dim != C / heads, a
  // sliding window of 20 keys over 80 rows (the window crosses the 64-row block), and bidirectional
  // attention (a vision encoder's).
  const Case cases[] = {{{4, 4, 8, 0}, 150},        {{4, 2, 8, 0}, 150},       {{4, 1, 8, 0}, 150},
                        {{4, 4, 16, 0}, 150},       {{4, 2, 16, 0}, 100},      {{4, 4, 8, 20}, 80},
                        {{4, 2, 16, 20}, 80},       {{6, 3, 8, 20}, 150},      {{4, 1, 8, 70}, 150},
                        {{4, 4, 8, 0, false}, 150}, {{2, 2, 12, 0, false}, 16}};
  const int B = 2;
  const int threads = omp_get_max_threads();
  for (const Case& c : cases) {
    const AttentionShape& shape = c.shape;
    const int T = c.T;
    INFO("heads " << shape.heads << ", kv_heads " << shape.kv_heads << ", head_dim " << shape.head_dim
                  << ", window " << shape.window << ", T " << T);
    const auto qkv = randn(size_t(B) * T * shape.qkv_width(), 1);
    const auto dout = randn(size_t(B) * T * shape.q_width(), 2);
    const std::vector<int32_t> first = packed_documents(B, T);
    for (const bool documents : {false, true}) {
      if (documents && !shape.causal) continue;  // a picture's patches are one sequence
      INFO((documents ? "packed documents" : shape.causal ? "causal" : "bidirectional"));
      const std::vector<int32_t> starts = documents ? first : std::vector<int32_t>{};
      std::vector<double> ref_out, ref_dqkv;
      reference_attention(qkv, dout, starts, B, T, shape, ref_out, ref_dqkv);
      std::vector<float> out1, lse1, dqkv1;
      for (int n : {1, 2}) {
        INFO(n << " threads");
        omp_set_num_threads(n);
        std::vector<float> out(size_t(B) * T * shape.q_width()), lse(size_t(B) * shape.heads * T),
            dqkv(qkv.size(), 123.0f);
        const int32_t* ds = documents ? first.data() : nullptr;
        k::attention_forward(out.data(), lse.data(), qkv.data(), ds, B, T, shape);
        CHECK(max_rel(out, ref_out) < 1e-5);
        k::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), ds, B, T, shape);
        CHECK(max_rel(dqkv, ref_dqkv) < 1e-5);
        if (n == 1) {
          out1 = out, lse1 = lse, dqkv1 = dqkv;
        } else {  // the same bits on any number of threads
          CHECK(same_bits(out, out1));
          CHECK(same_bits(lse, lse1));
          CHECK(same_bits(dqkv, dqkv1));
        }
      }
    }
  }
  omp_set_num_threads(threads);
}

// Context parallelism's unit: the sequence cut into 2·cp chunks, each query chunk's attention merged over
// every key chunk (in the ring's order: own chunks first, then the others; a future chunk passed in anyway
// must change nothing), and the gradients summed over the chunk pairs, give the whole sequence's attention
// and gradients: grouped-query heads, packed documents that cross chunks, windows, chunks of more than one
// 64-row block.
TEST_CASE("chunked attention merges to the whole sequence's", "[trainer][kernels]") {
  using forge::trainer::AttentionChunks;
  using forge::trainer::AttentionShape;
  using forge::trainer::ChunkRows;
  const AttentionShape shapes[] = {{4, 2, 16, 0}, {4, 4, 8, 0}, {4, 1, 8, 50}, {6, 3, 8, 20}};
  const int B = 2, T = 288;
  for (const AttentionShape& shape : shapes)
    for (const int cp : {2, 3})
      for (const bool documents : {false, true}) {
        INFO("heads " << shape.heads << ", kv_heads " << shape.kv_heads << ", window " << shape.window
                      << ", cp " << cp << (documents ? ", packed documents" : ""));
        const int W = shape.qkv_width(), QW = shape.q_width(), KW = shape.kv_width(), n = T / (2 * cp);
        const auto qkv = randn(size_t(B) * T * W, 3);
        const auto dout = randn(size_t(B) * T * QW, 4);
        const std::vector<int32_t> first = packed_documents(B, T);
        std::vector<int32_t> ids(first.size());
        for (size_t i = 0; i < ids.size(); ++i)
          ids[i] = i % size_t(T) == 0 ? 0 : ids[i - 1] + (first[i] != first[i - 1] ? 1 : 0);
        std::vector<double> ref_out, ref_dqkv;
        reference_attention(qkv, dout, documents ? first : std::vector<int32_t>{}, B, T, shape, ref_out,
                            ref_dqkv);
        const auto pair = [&](int qc, int kc) {
          AttentionChunks c;
          c.B = B, c.n = n, c.shape = shape, c.q_first = qc * n, c.k_first = kc * n;
          float* base = const_cast<float*>(qkv.data());
          c.q = {base + int64_t(qc) * n * W, int64_t(T) * W, W};
          c.k = {base + QW + int64_t(kc) * n * W, int64_t(T) * W, W};
          c.v = {c.k.base + KW, c.k.seq, W};
          if (documents) c.q_seg = ids.data() + qc * n, c.k_seg = ids.data() + kc * n, c.seg_seq = T;
          c.stats_seq = T;
          return c;
        };
        // Key chunks in a ring's order for the query chunk's rank, then one from the future.
        const auto order = [&](int qc) {
          std::vector<int> keys;
          for (int s = 0; s < 2 * cp; ++s) keys.push_back((qc + 2 * cp - s) % (2 * cp));
          return keys;
        };
        std::vector<float> out(size_t(B) * T * QW, 0.0f);
        std::vector<float> lse(size_t(B) * shape.heads * T, -std::numeric_limits<float>::infinity());
        for (int qc = 0; qc < 2 * cp; ++qc)
          for (const int kc : order(qc))
            k::attention_chunk_forward(pair(qc, kc), {out.data() + int64_t(qc) * n * QW, int64_t(T) * QW, QW},
                                       lse.data() + qc * n);
        CHECK(max_rel(out, ref_out) < 1e-5);
        std::vector<float> delta(lse.size());
        for (int b = 0; b < B; ++b)
          for (int h = 0; h < shape.heads; ++h)
            for (int t = 0; t < T; ++t) {
              double d = 0;
              for (int c = 0; c < shape.head_dim; ++c) {
                const size_t at = (size_t(b) * T + size_t(t)) * QW + size_t(h * shape.head_dim + c);
                d += double(out[at]) * dout[at];
              }
              delta[(size_t(b) * shape.heads + size_t(h)) * T + size_t(t)] = float(d);
            }
        std::vector<float> dqkv(qkv.size(), 0.0f);
        for (int qc = 0; qc < 2 * cp; ++qc)
          for (const int kc : order(qc)) {
            const ChunkRows dk{dqkv.data() + QW + int64_t(kc) * n * W, int64_t(T) * W, W};
            k::attention_chunk_backward(
                pair(qc, kc), {const_cast<float*>(dout.data()) + int64_t(qc) * n * QW, int64_t(T) * QW, QW},
                lse.data() + qc * n, delta.data() + qc * n,
                {dqkv.data() + int64_t(qc) * n * W, int64_t(T) * W, W}, dk, {dk.base + KW, dk.seq, W});
          }
        CHECK(max_rel(dqkv, ref_dqkv) < 1e-5);
      }
}

// A cp rank's part of a batch: its two chunks of every row, with explicit targets (the next token across
// the chunk's end comes from the whole row), the true positions and the whole row's document ids.
TEST_CASE("context_shard keeps a rank's two chunks with their targets, positions and documents",
          "[trainer][kernels]") {
  forge::MicroBatch full;
  full.resize(2, 16, forge::MicroBatch::Targets::kNextToken);
  for (int r = 0; r < 2; ++r) {
    std::vector<int32_t> window(17);
    for (int t = 0; t <= 16; ++t) window[size_t(t)] = 100 * r + t;
    full.set_window(r, window.data(), uint64_t(r), 0);
  }
  const int32_t starts[] = {6};
  full.set_documents(1, starts);
  const forge::MicroBatch part = forge::trainer::context_shard(full, 2, 1);  // chunks 1 and 2 of 4
  REQUIRE(part.rows == 2);
  REQUIRE(part.seq_len == 8);
  const int chunks[] = {4, 5, 6, 7, 8, 9, 10, 11};
  for (int r = 0; r < 2; ++r)
    for (int t = 0; t < 8; ++t) {
      const size_t i = size_t(r) * 8 + size_t(t), whole = size_t(r) * 16 + size_t(chunks[t]);
      CHECK(part.inputs[i] == full.inputs[whole]);
      CHECK(part.targets[i] == full.target(whole));
      CHECK(part.positions[i] == (r == 0 ? chunks[t] : full.positions[whole]));
      CHECK(part.segments[i] == full.segments[whole]);
    }
  CHECK(part.targets[7] == 12);       // row 0's chunk 2 ends at position 11: its target is the token after it
  CHECK(part.positions[8 + 2] == 0);  // row 1's second document starts at position 6
  CHECK_THROWS_AS(forge::trainer::context_shard(full, 3, 0), std::invalid_argument);
}

// Decoding a prompt in one call and then one token per call attends exactly as the full forward does.
TEST_CASE("attention decoding matches the full forward", "[trainer][kernels]") {
  using forge::trainer::AttentionShape;
  const int B = 2, T = 80, prompt = 13, max_len = 96;
  for (const AttentionShape shape : {AttentionShape{4, 4, 8, 0}, AttentionShape{4, 2, 16, 20},
                                     AttentionShape{4, 1, 8, 0}, AttentionShape{6, 3, 8, 7}}) {
    INFO("heads " << shape.heads << ", kv_heads " << shape.kv_heads << ", head_dim " << shape.head_dim
                  << ", window " << shape.window);
    const int W = shape.qkv_width(), QW = shape.q_width();
    const auto qkv = randn(size_t(B) * T * W, 3);
    std::vector<float> full(size_t(B) * T * QW), lse(size_t(B) * shape.heads * T);
    k::attention_forward(full.data(), lse.data(), qkv.data(), nullptr, B, T, shape);
    // Sequence s of the caches is batch row 1 - s (the rows of a call need not be in sequence order).
    std::vector<float> kc(size_t(B) * max_len * shape.kv_width(), 0.0f), vc(kc);
    std::vector<float> decoded(full.size(), 0.0f), rows_qkv, rows_out;
    std::vector<int32_t> seq, pos;
    for (int t0 = 0; t0 < T;) {
      const int n = t0 == 0 ? prompt : 1;  // the prompts of both sequences in one call, then a token each
      rows_qkv.clear(), seq.clear(), pos.clear();
      for (int b = 0; b < B; ++b)
        for (int t = t0; t < t0 + n; ++t) {
          const float* row = qkv.data() + (size_t(b) * T + t) * W;
          rows_qkv.insert(rows_qkv.end(), row, row + W);
          seq.push_back(1 - b);
          pos.push_back(t);
        }
      const int rows = int(seq.size());
      rows_out.assign(size_t(rows) * QW, 0.0f);
      k::attention_decode(rows_out.data(), rows_qkv.data(), kc.data(), vc.data(), seq.data(), pos.data(),
                          rows, max_len, shape);
      for (int r = 0; r < rows; ++r)
        std::copy_n(rows_out.data() + size_t(r) * QW, QW,
                    decoded.data() + (size_t(1 - seq[size_t(r)]) * T + pos[size_t(r)]) * QW);
      t0 += n;
    }
    double diff = 0, scale = 1e-30;
    for (size_t i = 0; i < full.size(); ++i) {
      diff = std::max(diff, double(std::abs(full[i] - decoded[i])));
      scale = std::max(scale, double(std::abs(full[i])));
    }
    CHECK(diff / scale < 1e-5);
  }
}

TEST_CASE("classifier with weighted cross-entropy matches the naive reference across chunks",
          "[trainer][kernels]") {
  namespace t = forge::trainer;
  const int N = 600, C = 16, V = 50;
  const auto x = randn(size_t(N) * C, 3), wte = randn(size_t(V) * C, 4, 0.5f);
  std::vector<int32_t> targets(N);
  std::vector<float> weights(N);
  for (int i = 0; i < N; ++i) {
    targets[size_t(i)] = i % 11 == 0 ? forge::MicroBatch::kIgnore : (i * 7) % V;
    weights[size_t(i)] = float(i % 4) * 0.5f;  // 0, 0.5, 1, 1.5
  }
  std::vector<double> ref_logits(size_t(N) * V), ref_dx(size_t(N) * C, 0.0), ref_dw(size_t(V) * C, 0.0);
  double ref_loss = 0;
  const double g = 1.0 / N;
  for (int i = 0; i < N; ++i) {
    double mx = -1e300;
    for (int v = 0; v < V; ++v) {
      double s = 0;
      for (int c = 0; c < C; ++c) s += double(x[size_t(i) * C + c]) * wte[size_t(v) * C + c];
      ref_logits[size_t(i) * V + v] = s;
      mx = std::max(mx, s);
    }
    const int tg = targets[size_t(i)];
    if (tg == forge::MicroBatch::kIgnore) continue;
    const double w = weights[size_t(i)];
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(ref_logits[size_t(i) * V + v] - mx);
    ref_loss += w * (mx + std::log(sum) - ref_logits[size_t(i) * V + tg]);
    for (int v = 0; v < V; ++v) {
      const double d = g * w * (std::exp(ref_logits[size_t(i) * V + v] - mx) / sum - (v == tg));
      for (int c = 0; c < C; ++c) {
        ref_dx[size_t(i) * C + c] += d * wte[size_t(v) * C + c];
        ref_dw[size_t(v) * C + c] += d * x[size_t(i) * C + c];
      }
    }
  }
  t::ParamInfo info;
  info.name = "wte.weight";
  info.shape = info.local_shape = {V, C};
  std::vector<float> logits(size_t(N) * V), dx(size_t(N) * C, 7.0f), dw(size_t(V) * C, 0.0f);
  t::Classifier classifier(t::cpu_backend(), {&info, wte.data(), dw.data()}, 0);
  t::DeviceBatch batch;
  batch.targets = targets.data();
  batch.weights = weights.data();
  const t::LmCrossEntropy loss_fn;
  const double loss =
      classifier.forward_backward(dx.data(), x.data(), batch, N, loss_fn, float(g), logits.data());
  CHECK(std::abs(loss - ref_loss) / ref_loss < 1e-5);
  CHECK(max_rel(logits, ref_logits) < 1e-5);
  CHECK(max_rel(dx, ref_dx) < 1e-5);
  CHECK(max_rel(dw, ref_dw) < 1e-5);
  // Loss only: no gradients touched.
  std::fill(dw.begin(), dw.end(), 0.0f);
  const double loss_only = classifier.forward_backward(nullptr, x.data(), batch, N, loss_fn, 1.0f, nullptr);
  CHECK(loss_only == Approx(loss).epsilon(1e-6));
  CHECK(std::all_of(dw.begin(), dw.end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE("layernorm (at its epsilon) and its backward match the naive reference; the backward accumulates",
          "[trainer][kernels]") {
  const int N = 37, C = 24;
  const auto in = randn(size_t(N) * C, 5, 2.0f), w = randn(size_t(C), 6), b = randn(size_t(C), 7);
  const auto dout = randn(size_t(N) * C, 8);
  std::vector<float> out(size_t(N) * C), mean(N), rstd(N), din(size_t(N) * C, 1.0f), dw(C, 0.0f), db(C, 0.0f);
  const float eps = 0.25f;  // far from the 1e-5 the kernel once held as a constant: it must use the given one
  k::layernorm_forward(out.data(), mean.data(), rstd.data(), in.data(), w.data(), b.data(), eps, N, C);
  k::layernorm_backward(din.data(), dw.data(), db.data(), dout.data(), in.data(), w.data(), mean.data(),
                        rstd.data(), N, C);
  std::vector<double> ref_out(out.size()), ref_din(din.size()), ref_dw(C, 0.0), ref_db(C, 0.0);
  for (int i = 0; i < N; ++i) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += in[size_t(i) * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += std::pow(in[size_t(i) * C + c] - m, 2);
    const double rs = 1.0 / std::sqrt(v / C + eps);
    double a = 0, bsum = 0;
    for (int c = 0; c < C; ++c) {
      const double n = (in[size_t(i) * C + c] - m) * rs;
      ref_out[size_t(i) * C + c] = n * w[c] + b[c];
      ref_dw[size_t(c)] += dout[size_t(i) * C + c] * n;
      ref_db[size_t(c)] += dout[size_t(i) * C + c];
      a += dout[size_t(i) * C + c] * w[c];
      bsum += dout[size_t(i) * C + c] * w[c] * n;
    }
    for (int c = 0; c < C; ++c) {
      const double n = (in[size_t(i) * C + c] - m) * rs;
      ref_din[size_t(i) * C + c] = 1.0 + rs * (dout[size_t(i) * C + c] * w[c] - a / C - n * bsum / C);
    }
  }
  CHECK(max_rel(out, ref_out) < 1e-5);
  CHECK(max_rel(din, ref_din) < 1e-5);
  CHECK(max_rel(dw, ref_dw) < 1e-5);
  CHECK(max_rel(db, ref_db) < 1e-5);
}

TEST_CASE("GELU backward is the derivative of GELU forward", "[trainer][kernels]") {
  const int N = 3, C = 200;
  std::vector<float> pre(size_t(N) * C), bias(C, 0.0f), out(pre.size());
  for (size_t i = 0; i < pre.size(); ++i) pre[i] = -6.0f + 12.0f * float(i) / float(pre.size());
  const auto x0 = pre;
  k::bias_gelu_forward(out.data(), pre.data(), bias.data(), N, C);
  std::vector<float> d(pre.size(), 1.0f);
  k::gelu_backward(d.data(), pre.data(), N, C);
  for (size_t i = 0; i < pre.size(); ++i) {
    const auto gelu = [](double x) {
      return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    };
    const double h = 1e-4, x = x0[i];
    INFO("x = " << x);
    CHECK(out[i] == Approx(gelu(x)).margin(1e-6));
    CHECK(d[i] == Approx((gelu(x + h) - gelu(x - h)) / (2 * h)).margin(1e-4));
  }
}

TEST_CASE("BF16 rounding is round-to-nearest-even and keeps specials", "[trainer][kernels]") {
  const auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  const auto from = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  std::vector<float> v = {1.0f,
                          from(0x3f808000u),
                          from(0x3f818000u),
                          from(0x3f808001u),
                          -2.5f,
                          std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          from(0x7f800001u)};
  k::round_to_bf16(v.data(), int64_t(v.size()));
  CHECK(bits(v[0]) == 0x3f800000u);
  CHECK(bits(v[1]) == 0x3f800000u);  // tie, rounds to even (down)
  CHECK(bits(v[2]) == 0x3f820000u);  // tie, rounds to even (up)
  CHECK(bits(v[3]) == 0x3f810000u);  // above the tie, up
  CHECK(v[4] == -2.5f);
  CHECK(std::isinf(v[5]));
  CHECK(std::isnan(v[6]));
  CHECK(std::isnan(v[7]));  // a NaN with only low mantissa bits stays NaN
}

TEST_CASE("2-byte BF16 storage holds exactly the rounded values", "[trainer][kernels]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1e3f, 1e3f);
  std::vector<float> v(1001);
  for (auto& x : v) x = u(rng);
  v[0] = std::numeric_limits<float>::infinity();
  v[1] = -0.0f;
  std::vector<uint16_t> half(v.size());
  std::vector<float> back(v.size()), rounded = v;
  k::to_bf16(half.data(), v.data(), int64_t(v.size()));
  k::from_bf16(back.data(), half.data(), int64_t(v.size()));
  k::round_to_bf16(rounded.data(), int64_t(v.size()));
  CHECK(std::memcmp(back.data(), rounded.data(), v.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(v.data(), rounded.data(), v.size() * sizeof(float)) == 0);  // rounded in place too
  CHECK(std::signbit(back[1]));
}

namespace {

std::vector<float> rounded(std::vector<float> v) {
  k::round_to_bf16(v.data(), int64_t(v.size()));
  return v;
}
std::vector<uint16_t> halves(size_t n) {
  return std::vector<uint16_t>(n, 0xffffu);  // NaN: what an op leaves unwritten shows
}
std::vector<float> widened(const std::vector<uint16_t>& h) {
  std::vector<float> v(h.size());
  k::from_bf16(v.data(), h.data(), int64_t(h.size()));
  return v;
}

}  // namespace

// The backend seam's BF16 activations (Act) on the CPU: an op reading them computes what its FP32 form
// computes on the widened values, and an op writing them stores its FP32 result rounded once, so a BF16
// model's numbers do not depend on where the rounding happens.
TEST_CASE("the CPU backend's ops on BF16 activations round each FP32 result once", "[trainer][kernels]") {
  namespace t = forge::trainer;
  t::Backend& be = t::cpu_backend();
  const int B = 2, T = 70, NH = 2, C = 32, N = B * T, H = 4 * C;  // T crosses the attention's row block
  const size_t NC = size_t(N) * C;
  const t::AttentionShape heads{NH, NH, C / NH, 0};
  const auto x = randn(NC, 1), delta = randn(NC, 2), lnw = randn(C, 3), lnb = randn(C, 4),
             wqkv = rounded(randn(3 * size_t(C) * C, 5, 0.2f)), bqkv = randn(3 * size_t(C), 6),
             wfc = rounded(randn(size_t(H) * C, 7, 0.3f)), bfc = randn(size_t(H), 8), dqkv_out = randn(NC, 9),
             dact = randn(size_t(N) * H, 10);
  std::vector<float> mean(size_t(N), 0.0f), rstd(mean), mean2(mean), rstd2(mean), res(NC), res2(NC);

  auto ln = halves(NC);
  std::vector<float> ln32(NC);
  be.layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), lnw.data(), lnb.data(), 1e-5f, N, C);
  be.layernorm_forward(ln32.data(), mean2.data(), rstd2.data(), x.data(), lnw.data(), lnb.data(), 1e-5f, N,
                       C);
  CHECK(same_bits(widened(ln), rounded(ln32)));
  CHECK(same_bits(mean, mean2));
  auto ln2 = halves(NC);
  be.residual_layernorm_forward(res.data(), ln2.data(), mean.data(), rstd.data(), x.data(), delta.data(),
                                lnb.data(), lnw.data(), lnb.data(), 1e-5f, N, C);
  be.residual_layernorm_forward(res2.data(), ln32.data(), mean2.data(), rstd2.data(), x.data(), delta.data(),
                                lnb.data(), lnw.data(), lnb.data(), 1e-5f, N, C);
  CHECK(same_bits(widened(ln2), rounded(ln32)));
  CHECK(same_bits(res, res2));

  const auto ln_values = widened(ln);
  auto qkv = halves(3 * NC);
  std::vector<float> qkv32(3 * NC);
  be.matmul_forward(qkv.data(), ln.data(), wqkv.data(), bqkv.data(), N, C, 3 * C);
  be.matmul_forward(qkv32.data(), ln_values.data(), wqkv.data(), bqkv.data(), N, C, 3 * C);
  CHECK(same_bits(widened(qkv), rounded(qkv32)));

  const auto qkv_values = widened(qkv);
  auto att = halves(NC);
  std::vector<float> att32(NC), lse(size_t(B) * NH * T), lse32(lse.size());
  be.attention_forward(att.data(), lse.data(), qkv.data(), nullptr, B, T, heads);
  be.attention_forward(att32.data(), lse32.data(), qkv_values.data(), nullptr, B, T, heads);
  CHECK(same_bits(widened(att), rounded(att32)));
  CHECK(same_bits(lse, lse32));
  std::vector<float> dqkv(3 * NC), dqkv32(3 * NC);
  const auto att_values = widened(att);
  be.attention_backward(dqkv.data(), dqkv_out.data(), qkv.data(), att.data(), lse.data(), nullptr, B, T,
                        heads);
  be.attention_backward(dqkv32.data(), dqkv_out.data(), qkv_values.data(), att_values.data(), lse.data(),
                        nullptr, B, T, heads);
  CHECK(same_bits(dqkv, dqkv32));

  // The MLP's first product: the GELU of the pre-activation before it is rounded, then both rounded.
  auto pre = halves(size_t(N) * H), act = halves(size_t(N) * H);
  std::vector<float> pre32(pre.size()), act32(pre.size());
  be.matmul_bias_gelu_forward(act.data(), pre.data(), ln.data(), wfc.data(), bfc.data(), N, C, H);
  be.matmul_forward(pre32.data(), ln_values.data(), wfc.data(), nullptr, N, C, H);
  k::bias_gelu_forward(act32.data(), pre32.data(), bfc.data(), N, H);
  CHECK(same_bits(widened(pre), rounded(pre32)));
  CHECK(same_bits(widened(act), rounded(act32)));
  std::vector<float> d = dact, d32 = dact;
  be.gelu_backward(d.data(), pre.data(), N, H);
  be.gelu_backward(d32.data(), widened(pre).data(), N, H);
  CHECK(same_bits(d, d32));
  std::vector<float> din(NC), din32(NC), dw(wfc.size(), 0.5f), dw32(dw), db(bfc.size(), 0.5f), db32(db);
  be.matmul_backward(din.data(), dw.data(), db.data(), dact.data(), ln.data(), wfc.data(), N, C, H);
  be.matmul_backward(din32.data(), dw32.data(), db32.data(), dact.data(), ln_values.data(), wfc.data(), N, C,
                     H);
  CHECK(same_bits(din, din32));
  CHECK(same_bits(dw, dw32));

  const std::vector<int32_t> index = {5, 0, 139, 5};
  const std::vector<float> scale = {2.0f, -1.0f, 0.5f, 1.0f};
  std::vector<float> rows(4 * size_t(C)), rows32(rows.size());
  be.gather_rows(rows.data(), ln.data(), index.data(), scale.data(), 4, C);
  be.gather_rows(rows32.data(), ln_values.data(), index.data(), scale.data(), 4, C);
  CHECK(same_bits(rows, rows32));

  // Decoding: 3 rows of two sequences into FP32 caches.
  const std::vector<int32_t> seq = {0, 1, 1}, pos = {0, 0, 1};
  std::vector<float> kc(2 * 4 * size_t(C), 0.0f), vc(kc), kc32(kc), vc32(kc), dec32(3 * size_t(C));
  auto dec = halves(3 * size_t(C));
  be.attention_decode(dec.data(), qkv.data(), kc.data(), vc.data(), seq.data(), pos.data(), 3, 4, heads);
  be.attention_decode(dec32.data(), qkv_values.data(), kc32.data(), vc32.data(), seq.data(), pos.data(), 3, 4,
                      heads);
  CHECK(same_bits(widened(dec), rounded(dec32)));
  CHECK(same_bits(kc, kc32));
}

// An OpenMP reduction adds the threads' partial sums as they finish: with more threads than cores the
// order changes from call to call, and so did the gradient norm's last bit (and with it the clipping).
TEST_CASE("the gradient norm's and the loss's sums are the same on every call", "[trainer][kernels]") {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(7);
  const auto g = randn(100003, 11);
  const std::vector<forge::trainer::FlatRange> ranges{{0, 40000}, {40000, 40001}, {50000, 100003}};
  std::vector<float> logits0 = randn(size_t(301) * 64, 12), logits(logits0.size()), weights(301, 0.5f);
  std::vector<int32_t> targets(301);
  for (size_t i = 0; i < targets.size(); ++i) targets[i] = int32_t(i % 64);
  double norm0 = 0, loss0 = 0;
  bool same = true;
  for (int call = 0; call < 40; ++call) {
    logits = logits0;
    const double norm = k::sum_squares(g.data(), ranges);
    const double loss = k::cross_entropy(logits.data(), targets.data(), weights.data(), 301, 64, 0, 1.0f,
                                         true, nullptr, nullptr);
    if (call == 0) norm0 = norm, loss0 = loss;
    same = same && norm == norm0 && loss == loss0;
  }
  omp_set_num_threads(threads);
  CHECK(same);
}
