// The Mixture-of-Experts layer (moe.h). The router's small [N, experts] arithmetic runs on the host (the
// sizes of the exchange must reach the host anyway); the rows move through the backend's gather and
// combine ops, and each expert is one matrix product per weight over the rows it received, back to back.
//
// Row orders. "Sent" rows: this rank's kept assignments sorted by expert, then token. The exchange
// delivers, from each source rank in turn, its rows for this rank's experts in that order; "expert-major"
// regroups them by local expert, then source rank, so every expert's rows are contiguous.
#include "forge/trainer/moe.h"

#include "forge/common/trace.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace forge::trainer {

namespace {

// A buffer of at least n elements (contents not kept when it grows).
template <typename T>
T* reserve(Backend& backend, Buffer<T>& buffer, size_t n) {
  if (buffer.size() < n) buffer = backend.alloc<T>(std::max(n, buffer.size() + buffer.size() / 4));
  return buffer.data();
}

// ... of activations, FP32 or BF16 as `bf16` says.
void reserve(Backend& backend, ActBuffer& buffer, size_t n, bool bf16) {
  if (buffer.size() < n) buffer = ActBuffer(backend, std::max(n, buffer.size() + buffer.size() / 4), bf16);
}

// Expert e's part of a parameter (`n` values each), or null for a missing one (no bias; a frozen
// gradient).
template <typename T>
T* part(T* p, int e, int64_t n) {
  return p != nullptr ? p + e * n : nullptr;
}

}  // namespace

struct MoeLayer::Slot {
  int N = 0, A = 0, R = 0;     // tokens, rows sent, rows received
  double sequence_tokens = 0;  // the micro-batch's tokens over the context-parallel group (N at cp 1)
  Routing routing;
  std::vector<float> probs, lse;              // [N, E], [N]
  std::vector<double> routed_share;           // [E]: f_i
  std::vector<int32_t> send_token;            // [A]: the token of each sent row
  std::vector<float> send_gate;               // [A]
  std::vector<int64_t> send_rows, recv_rows;  // [P]
  std::vector<int32_t> expert_major, source;  // [R]: received row of each expert-major row, and back
  std::vector<int> expert_begin;              // [E_local + 1]: expert-major rows of each local expert
  // Backend copies of the index arrays (device backends) and what backward reads.
  Buffer<int32_t> row_d, send_token_d, expert_major_d, source_d;
  Buffer<float> send_gate_d, gate_d;
  Buffer<float> x, y;  // expert-major [R, C]; y: sent order [A, C]
  // Expert-major, what the second product and the activation's backward read again: pre [R, H] (GELU) or
  // [R, 2H] (SwiGLU's gate | up), act [R, H].
  ActBuffer pre, act;

  size_t bytes() const {
    size_t n = pre.bytes() + act.bytes();
    for (const auto* b : {&send_gate_d, &gate_d, &x, &y}) n += b->size() * sizeof(float);
    for (const auto* b : {&row_d, &send_token_d, &expert_major_d, &source_d})
      n += b->size() * sizeof(int32_t);
    return n;
  }
};

// Scratch shared by the slots: rows in flight ([rows, C] each), the experts' activation gradient, and
// (SwiGLU) that of the gate | up product.
struct MoeLayer::Work {
  Buffer<float> logits, a, b, c, dact, dpre;
  std::vector<float> dlogits, dgate;

  size_t bytes() const {
    size_t n = 0;
    for (const auto* v : {&logits, &a, &b, &c, &dact, &dpre}) n += v->size() * sizeof(float);
    return n;
  }
};

MoeLayer::MoeLayer(Backend& backend, const MoeSettings& settings, int layer, ParamRef router,
                   ParamRef fc_weight, ParamRef fc_bias, ParamRef proj_weight, ParamRef proj_bias,
                   std::unique_ptr<TokenExchange> exchange, int slots, int rows)
    : backend_(backend),
      settings_(settings),
      layer_(layer),
      router_(router),
      fc_w_(fc_weight),
      fc_b_(fc_bias),
      proj_w_(proj_weight),
      proj_b_(proj_bias),
      exchange_(std::move(exchange)) {
  const int E = settings.experts;
  if (E < 1 || settings.top_k < 1 || settings.top_k > E)
    throw std::invalid_argument("MoeLayer: needs 1 <= top_k <= experts");
  if (E % exchange_->size() != 0)
    throw std::invalid_argument("MoeLayer: the experts do not split over the exchange's ranks");
  local_experts_ = E / exchange_->size();
  C_ = int(router.info->shape[1]);
  fc_width_ = int(fc_weight.info->shape[1]);
  if (settings.swiglu && fc_width_ % 2 != 0)
    throw std::invalid_argument("MoeLayer: the SwiGLU experts' gate_up weight needs 2 x hidden rows");
  H_ = settings.swiglu ? fc_width_ / 2 : fc_width_;
  if (fc_weight.info->local_shape[0] != local_experts_ || proj_weight.info->local_shape[0] != local_experts_)
    throw std::invalid_argument("MoeLayer: the expert weights are not this rank's share of the experts");
  if (proj_weight.info->shape[1] != C_ || proj_weight.info->shape[2] != H_)
    throw std::invalid_argument("MoeLayer: the experts' second weight is not [experts, C, hidden]");
  // Buffers for balanced routing (every rank receives as many rows as it sends), so the memory plan sees
  // them from the start; they grow when a rank's experts receive more.
  const size_t rows_k = size_t(rows) * size_t(settings.top_k);
  for (int s = 0; s < slots; ++s) {
    auto slot = std::make_unique<Slot>();
    for (auto* b : {&slot->x, &slot->y}) reserve(backend, *b, rows_k * size_t(C_));
    reserve(backend, slot->pre, rows_k * size_t(fc_width_), settings.bf16);
    reserve(backend, slot->act, rows_k * size_t(H_), settings.bf16);
    slots_.push_back(std::move(slot));
  }
  work_ = std::make_unique<Work>();
  work_->logits = backend.alloc<float>(size_t(rows) * size_t(E));
  for (auto* b : {&work_->a, &work_->b, &work_->c}) reserve(backend, *b, rows_k * size_t(C_));
  reserve(backend, work_->dact, rows_k * size_t(H_));
  if (settings.swiglu) reserve(backend, work_->dpre, rows_k * size_t(fc_width_));
  // The output's zero bias; without fc biases, GELU's fused bias add takes its first H zeros.
  const bool zero_fc_bias = !settings.swiglu && fc_bias.value == nullptr;
  zero_bias_ = backend.alloc<float>(size_t(zero_fc_bias ? std::max(C_, H_) : C_));
  stats_.tokens.assign(size_t(E), 0.0);
}

MoeLayer::~MoeLayer() = default;

const float* MoeLayer::output_bias() const {
  return zero_bias_.data();
}

size_t MoeLayer::activation_bytes() const {
  size_t n = work_->bytes() + zero_bias_.size() * sizeof(float);
  for (const auto& s : slots_) n += s->bytes();
  return n;
}

const MoeLayer::Routing& MoeLayer::routing(int slot) const {
  return slots_.at(size_t(slot))->routing;
}

RouterStats MoeLayer::take_stats() {
  RouterStats out = std::move(stats_);
  out.layer = layer_;
  stats_ = RouterStats{};
  stats_.tokens.assign(size_t(settings_.experts), 0.0);
  return out;
}

void MoeLayer::route(Slot& s, ConstAct in, int N) {
  const int E = settings_.experts, k = settings_.top_k, P = exchange_->size(), El = local_experts_;
  s.N = N;
  backend_.matmul_forward(work_->logits.data(), in, router_.value, nullptr, N, C_, E);
  s.probs.resize(size_t(N) * size_t(E));
  s.lse.resize(size_t(N));
  backend_.copy_to_host(s.probs.data(), work_->logits.data(), s.probs.size() * sizeof(float));
  Routing& r = s.routing;
  r.expert.assign(size_t(N) * size_t(k), -1);
  r.gate.assign(size_t(N) * size_t(k), 0.0f);
  r.row.assign(size_t(N) * size_t(k), -1);
  std::vector<double> mean_prob(size_t(E), 0.0), routed(size_t(E), 0.0);
  double entropy = 0, z = 0;
  for (int t = 0; t < N; ++t) {
    float* p = s.probs.data() + int64_t(t) * E;
    const float m = *std::max_element(p, p + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(double(p[e]) - m);
    const double lse = double(m) + std::log(sum);
    s.lse[size_t(t)] = float(lse);
    z += lse * lse;
    for (int e = 0; e < E; ++e) {
      const double q = std::exp(double(p[e]) - lse);
      p[e] = float(q);
      mean_prob[size_t(e)] += q;
      if (q > 0) entropy -= q * std::log(q);
    }
    // Top-k by probability, ties to the lower index; k is small.
    for (int j = 0; j < k; ++j) {
      int best = -1;
      if (settings_.round_robin) {
        best = int((int64_t(t) * k + j) % E);
      } else {
        for (int e = 0; e < E; ++e) {
          if (e == settings_.banned_expert) continue;
          bool taken = false;
          for (int i = 0; i < j; ++i) taken = taken || r.expert[size_t(t) * k + size_t(i)] == e;
          if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
      }
      r.expert[size_t(t) * k + size_t(j)] = best;
      r.gate[size_t(t) * k + size_t(j)] = p[best];
      routed[size_t(best)] += 1;
    }
    if (settings_.renormalize) {
      float* g = r.gate.data() + size_t(t) * k;
      double sum_k = 0;
      for (int j = 0; j < k; ++j) sum_k += g[j];
      for (int j = 0; j < k; ++j) g[j] = float(g[j] / sum_k);
    }
  }
  // Capacity: first choices before second ones, each in token order.
  std::vector<int64_t> kept(size_t(E), 0);
  const int64_t cap = settings_.capacity_factor > 0
                          ? int64_t(std::ceil(settings_.capacity_factor * N * k / E))
                          : std::numeric_limits<int64_t>::max();
  std::vector<char> keep(size_t(N) * size_t(k), 0);
  for (int j = 0; j < k; ++j)
    for (int t = 0; t < N; ++t) {
      const size_t a = size_t(t) * k + size_t(j);
      const int e = r.expert[a];
      if (kept[size_t(e)] < cap) {
        ++kept[size_t(e)];
        keep[a] = 1;
      }
    }
  // Sent rows: by expert, then token.
  std::vector<int64_t> next(size_t(E), 0);
  for (int e = 1; e < E; ++e) next[size_t(e)] = next[size_t(e) - 1] + kept[size_t(e) - 1];
  s.A = int(std::accumulate(kept.begin(), kept.end(), int64_t(0)));
  s.send_token.resize(size_t(s.A));
  s.send_gate.resize(size_t(s.A));
  for (int t = 0; t < N; ++t)
    for (int j = 0; j < k; ++j) {
      const size_t a = size_t(t) * k + size_t(j);
      if (!keep[a]) continue;
      const int64_t row = next[size_t(r.expert[a])]++;
      r.row[a] = int32_t(row);
      s.send_token[size_t(row)] = t;
      s.send_gate[size_t(row)] = r.gate[a];
    }
  // Losses and figures of this micro-batch. Under context parallelism the rest of its tokens are on the
  // other ranks of the cp group: the balance loss is over all of them (its f_i and P_i summed there), and
  // each rank holds its tokens' share of the z-loss.
  const int context = exchange_->context_size();
  s.sequence_tokens = N;
  if (context > 1) {
    std::vector<double> sums(mean_prob);
    sums.insert(sums.end(), routed.begin(), routed.end());
    sums.push_back(N);
    exchange_->sum_over_context(sums.data(), int(sums.size()));
    std::copy(sums.begin(), sums.begin() + E, mean_prob.begin());
    std::copy(sums.begin() + E, sums.begin() + 2 * E, routed.begin());
    s.sequence_tokens = sums.back();
  }
  // No tokens (a rank of an expert-parallel group that has nothing left to decode): nothing to count.
  const double tokens = std::max(s.sequence_tokens, 1.0);
  s.routed_share.resize(size_t(E));
  double aux = 0;
  for (int e = 0; e < E; ++e) {
    s.routed_share[size_t(e)] = routed[size_t(e)] / (tokens * k);
    aux += s.routed_share[size_t(e)] * mean_prob[size_t(e)] / tokens;
  }
  r.aux = settings_.aux_coef * E * aux;
  r.z = settings_.z_coef * z / tokens;
  for (int e = 0; e < E; ++e) stats_.tokens[size_t(e)] += double(kept[size_t(e)]);
  stats_.assignments += double(N) * k;
  stats_.dropped += double(N) * k - s.A;
  stats_.entropy += entropy;
  // Summed over the cp group, the figures count each micro-batch once: its aux a share per rank.
  stats_.aux += r.aux / context;
  stats_.z += r.z;
  stats_.token_count += N;
  stats_.micro_batches += 1.0 / context;

  // The exchange's sizes: kept rows per expert to the rank holding it; per local expert from each rank.
  std::vector<int64_t> from(size_t(P) * size_t(El));
  exchange_->exchange_counts(kept.data(), from.data(), El);
  s.send_rows.assign(size_t(P), 0);
  s.recv_rows.assign(size_t(P), 0);
  for (int q = 0; q < P; ++q)
    for (int e = 0; e < El; ++e) {
      s.send_rows[size_t(q)] += kept[size_t(q) * El + size_t(e)];
      s.recv_rows[size_t(q)] += from[size_t(q) * El + size_t(e)];
    }
  s.R = int(std::accumulate(s.recv_rows.begin(), s.recv_rows.end(), int64_t(0)));
  // Expert-major order of the received rows: local expert, then source rank.
  std::vector<int64_t> at(size_t(P) * size_t(El));
  for (int q = 0, row = 0; q < P; ++q)
    for (int e = 0; e < El; ++e) {
      at[size_t(q) * El + size_t(e)] = row;
      row += int(from[size_t(q) * El + size_t(e)]);
    }
  s.expert_major.resize(size_t(s.R));
  s.source.resize(size_t(s.R));
  s.expert_begin.assign(size_t(El) + 1, 0);
  int out = 0;
  for (int e = 0; e < El; ++e) {
    for (int q = 0; q < P; ++q)
      for (int64_t i = 0; i < from[size_t(q) * El + size_t(e)]; ++i, ++out) {
        const int32_t received = int32_t(at[size_t(q) * El + size_t(e)] + i);
        s.expert_major[size_t(out)] = received;
        s.source[size_t(received)] = out;
      }
    s.expert_begin[size_t(e) + 1] = out;
  }
}

namespace {

// The backend's copy of host index values (the host vector itself on a host backend).
template <typename T>
const T* place(Backend& backend, Buffer<T>& buffer, const std::vector<T>& host) {
  if (backend.host_memory()) return host.data();
  T* d = reserve(backend, buffer, std::max<size_t>(host.size(), 1));
  backend.copy_from_host(d, host.data(), host.size() * sizeof(T));
  return d;
}

}  // namespace

void MoeLayer::forward(int slot, ConstAct in, float* out, int rows) {
  Slot& s = *slots_.at(size_t(slot));
  Work& w = *work_;
  const int k = settings_.top_k, C = C_, H = H_, F = fc_width_;
  {
    TraceSpan span("router", "compute", layer_);
    route(s, in, rows);
  }
  const bool exchanged = exchange_->size() > 1;
  const int32_t* row = place(backend_, s.row_d, s.routing.row);
  const int32_t* token = place(backend_, s.send_token_d, s.send_token);
  const int32_t* major = exchanged ? place(backend_, s.expert_major_d, s.expert_major) : nullptr;
  const int32_t* source = exchanged ? place(backend_, s.source_d, s.source) : nullptr;
  place(backend_, s.send_gate_d, s.send_gate);
  const float* gate = place(backend_, s.gate_d, s.routing.gate);
  const size_t most = size_t(std::max({s.A, s.R, 1}));
  float* a = reserve(backend_, w.a, most * C);
  float* b = reserve(backend_, w.b, most * C);
  float* x = reserve(backend_, s.x, size_t(std::max(s.R, 1)) * C);
  reserve(backend_, s.pre, size_t(std::max(s.R, 1)) * F, settings_.bf16);
  reserve(backend_, s.act, size_t(std::max(s.R, 1)) * H, settings_.bf16);
  float* y = reserve(backend_, s.y, size_t(std::max(s.A, 1)) * C);
  // Dispatch: the kept assignments' rows to their experts, regrouped by expert.
  backend_.gather_rows(exchanged ? a : x, in, token, nullptr, s.A, C);
  if (exchanged) {
    TraceSpan span("all-to-all dispatch", "comm", layer_);
    exchange_->exchange_rows(backend_, a, s.send_rows.data(), b, s.recv_rows.data(), C);
    backend_.gather_rows(x, b, major, nullptr, s.R, C);
  }
  float* ye = exchanged ? a : y;  // the experts' outputs, expert-major
  {
    TraceSpan span("experts forward", "compute", layer_);
    for (int e = 0; e < local_experts_; ++e) {
      const int r0 = s.expert_begin[size_t(e)], n = s.expert_begin[size_t(e) + 1] - r0;
      if (n == 0) continue;
      const Act act = s.act.at(size_t(r0) * H), pre = s.pre.at(size_t(r0) * F);
      const float* fc_w = fc_w_.value + int64_t(e) * F * C;
      if (settings_.swiglu) {
        backend_.matmul_forward(pre, x + int64_t(r0) * C, fc_w, part(fc_b_.value, e, F), n, C, F);
        backend_.swiglu_forward(act, pre, n, H);
      } else {
        const float* fc_b = fc_b_.value != nullptr ? fc_b_.value + int64_t(e) * H : zero_bias_.data();
        backend_.matmul_bias_gelu_forward(act, pre, x + int64_t(r0) * C, fc_w, fc_b, n, C, H);
      }
      backend_.matmul_forward(ye + int64_t(r0) * C, act, proj_w_.value + int64_t(e) * C * H,
                              part(proj_b_.value, e, C), n, H, C);
    }
  }
  // Combine: the outputs back to their tokens' ranks, in sent order, weighted by the gates.
  if (exchanged) {
    backend_.gather_rows(b, a, source, nullptr, s.R, C);
    TraceSpan span("all-to-all combine", "comm", layer_);
    exchange_->exchange_rows(backend_, b, s.recv_rows.data(), y, s.send_rows.data(), C);
  }
  backend_.combine_rows(out, y, row, gate, rows, k, C, false);
}

void MoeLayer::backward(int slot, ConstAct in, const float* dout, float* din, int rows) {
  Slot& s = *slots_.at(size_t(slot));
  Work& w = *work_;
  const int E = settings_.experts, k = settings_.top_k, N = rows, C = C_;
  if (N != s.N) throw std::invalid_argument("MoeLayer::backward: not the rows forward ran on");
  const bool exchanged = exchange_->size() > 1;
  const bool host = backend_.host_memory();
  const int32_t* row = host ? s.routing.row.data() : s.row_d.data();
  const int32_t* token = host ? s.send_token.data() : s.send_token_d.data();
  const float* send_gate = host ? s.send_gate.data() : s.send_gate_d.data();
  const int32_t* major = host ? s.expert_major.data() : s.expert_major_d.data();
  const int32_t* source = host ? s.source.data() : s.source_d.data();
  // The router: dL/dgate of each kept assignment is <dout[t], y>; the losses add their own terms.
  {
    TraceSpan span("router backward", "compute", layer_);
    w.dgate.resize(size_t(N) * k);
    float* dg = reserve(backend_, w.c, size_t(N) * k);
    backend_.row_dots(dg, dout, s.y.data(), row, N, k, C);
    backend_.copy_to_host(w.dgate.data(), dg, w.dgate.size() * sizeof(float));
    w.dlogits.resize(size_t(N) * E);
    const double aux_scale = loss_weight_ * settings_.aux_coef * E / s.sequence_tokens;
    const double z_scale = loss_weight_ * settings_.z_coef * 2.0 / s.sequence_tokens;
    std::vector<double> dp(static_cast<size_t>(E));
    for (int t = 0; t < N; ++t) {
      const float* p = s.probs.data() + int64_t(t) * E;
      for (int e = 0; e < E; ++e) dp[size_t(e)] = aux_scale * s.routed_share[size_t(e)];
      if (settings_.renormalize) {
        // gate_j = p_j / S, S = sum of the k chosen p: dL/dp_i = (dL/dgate_i - sum_j gate_j dL/dgate_j) / S
        // for every chosen i (a dropped one has dL/dgate 0 but is in S).
        const int32_t* chosen = s.routing.expert.data() + size_t(t) * k;
        const float* dg = w.dgate.data() + size_t(t) * k;
        double sum_k = 0, gdg = 0;
        for (int j = 0; j < k; ++j) sum_k += p[chosen[j]];
        for (int j = 0; j < k; ++j) gdg += p[chosen[j]] / sum_k * dg[j];
        for (int j = 0; j < k; ++j) dp[size_t(chosen[j])] += (dg[j] - gdg) / sum_k;
      } else {
        for (int j = 0; j < k; ++j) {
          const size_t a = size_t(t) * k + size_t(j);
          if (s.routing.row[a] >= 0) dp[size_t(s.routing.expert[a])] += w.dgate[a];
        }
      }
      double dot = 0;
      for (int e = 0; e < E; ++e) dot += p[e] * dp[size_t(e)];
      const double zt = z_scale * s.lse[size_t(t)];
      for (int e = 0; e < E; ++e)
        w.dlogits[size_t(t) * E + size_t(e)] = float(p[e] * (dp[size_t(e)] - dot) + zt * p[e]);
    }
    backend_.copy_from_host(w.logits.data(), w.dlogits.data(), w.dlogits.size() * sizeof(float));
    backend_.linear_backward(din, router_.grad, nullptr, w.logits.data(), in, router_.value, N, C, E);
  }
  const size_t most = size_t(std::max({s.A, s.R, 1}));
  float* a = reserve(backend_, w.a, most * C);
  float* b = reserve(backend_, w.b, most * C);
  float* c = reserve(backend_, w.c, most * C);
  // dL/dy of each sent row: its gate x dout of its token; to the experts, expert-major.
  backend_.gather_rows(a, dout, token, send_gate, s.A, C);
  float* dye = a;
  if (exchanged) {
    TraceSpan span("all-to-all dispatch (backward)", "comm", layer_);
    exchange_->exchange_rows(backend_, a, s.send_rows.data(), b, s.recv_rows.data(), C);
    backend_.gather_rows(a, b, major, nullptr, s.R, C);
  }
  expert_backward(s, dye, b);  // b: dL/dx, expert-major
  const float* dxs = b;        // in sent order
  if (exchanged) {
    backend_.gather_rows(c, b, source, nullptr, s.R, C);
    TraceSpan span("all-to-all combine (backward)", "comm", layer_);
    exchange_->exchange_rows(backend_, c, s.recv_rows.data(), a, s.send_rows.data(), C);
    dxs = a;
  }
  backend_.combine_rows(din, dxs, row, nullptr, N, k, C, true);
}

void MoeLayer::expert_backward(Slot& s, const float* dy, float* dx) {
  TraceSpan span("experts backward", "compute", layer_);
  const int C = C_, H = H_, F = fc_width_;
  float* dact = reserve(backend_, work_->dact, size_t(std::max(s.R, 1)) * H);
  float* dpre = settings_.swiglu ? reserve(backend_, work_->dpre, size_t(std::max(s.R, 1)) * F) : dact;
  for (int e = 0; e < local_experts_; ++e) {
    const int r0 = s.expert_begin[size_t(e)], n = s.expert_begin[size_t(e) + 1] - r0;
    if (n == 0) continue;
    float* da = dact + int64_t(r0) * H;
    backend_.linear_backward(da, part(proj_w_.grad, e, int64_t(C) * H), part(proj_b_.grad, e, C),
                             dy + int64_t(r0) * C, s.act.at(size_t(r0) * H),
                             proj_w_.value + int64_t(e) * C * H, n, H, C);
    float* dp = dpre + int64_t(r0) * F;  // dL/d(pre): in place for GELU
    if (settings_.swiglu)
      backend_.swiglu_backward(dp, da, s.pre.at(size_t(r0) * F), n, H);
    else
      backend_.gelu_backward(dp, s.pre.at(size_t(r0) * F), n, H);
    backend_.linear_backward(dx + int64_t(r0) * C, part(fc_w_.grad, e, int64_t(F) * C),
                             part(fc_b_.grad, e, F), dp, s.x.data() + int64_t(r0) * C,
                             fc_w_.value + int64_t(e) * F * C, n, C, F);
  }
}

}  // namespace forge::trainer
