#include "forge/eval_gate/generate.h"

#include "forge/common/hash.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <numeric>
#include <stdexcept>

namespace forge::gate {

int32_t pick_token(std::span<const float> logits, const Sampling& s, double u) {
  if (logits.empty()) throw std::invalid_argument("pick_token: no logits");
  if (s.temperature <= 0)
    return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());  // first of equals
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const auto before = [&](int32_t a, int32_t b) {
    return logits[size_t(a)] != logits[size_t(b)] ? logits[size_t(a)] > logits[size_t(b)] : a < b;
  };
  size_t keep = order.size();
  if (s.top_k > 0 && size_t(s.top_k) < keep) {
    keep = size_t(s.top_k);
    std::partial_sort(order.begin(), order.begin() + ptrdiff_t(keep), order.end(), before);
  } else {
    std::sort(order.begin(), order.end(), before);
  }
  // Softmax of the kept logits at the temperature, in double.
  std::vector<double> p(keep);
  const double top = logits[size_t(order[0])];
  double sum = 0;
  for (size_t i = 0; i < keep; ++i)
    sum += p[i] = std::exp((double(logits[size_t(order[i])]) - top) / s.temperature);
  // Nucleus: the most likely tokens until their mass reaches top_p (at least one).
  if (s.top_p < 1) {
    double mass = 0;
    size_t n = 0;
    while (n < keep && mass < s.top_p * sum) mass += p[n++];
    keep = std::max<size_t>(n, 1);
    sum = mass > 0 ? mass : p[0];
  }
  const double target = u * sum;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (target < acc) return order[i];
  }
  return order[keep - 1];  // u * sum rounded up to the total
}

double sample_draw(uint64_t seed, uint64_t key, int step) {
  const uint64_t words[3] = {seed, key, uint64_t(step)};
  return double(xxh3_64(words, sizeof(words)) >> 11) * 0x1.0p-53;
}

Generator::Generator(trainer::GPT& model, int batch, int max_len)
    : model_(model),
      batch_(batch),
      cache_(model, batch, max_len > 0 ? max_len : model.config().max_positions) {
  if (int64_t(batch) * cache_.max_len() > model.rows())
    throw std::invalid_argument("Generator: the model's rows() must hold batch x max_len");
}

namespace {

// log softmax(logits)[token], in double.
float token_logp(std::span<const float> logits, int32_t token) {
  const double top = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float x : logits) sum += std::exp(double(x) - top);
  return float(double(logits[size_t(token)]) - top - std::log(sum));
}

}  // namespace

std::vector<Generation> Generator::run(std::span<const Request> requests, const Sampling& s,
                                       const std::function<void(size_t, const Generation&)>& on_done) {
  const auto t0 = std::chrono::steady_clock::now();
  const int V = model_.config().vocab, max_len = cache_.max_len();
  std::vector<Generation> out(requests.size());
  struct Slot {
    int64_t request = -1;  // -1: free
    int position = 0;      // the next free position: where `next` is fed
    int32_t next = 0;
  };
  std::vector<Slot> slots(static_cast<size_t>(batch_));
  std::deque<size_t> waiting(requests.size());
  std::iota(waiting.begin(), waiting.end(), size_t{0});
  std::vector<trainer::DecodeRow> rows;
  std::vector<trainer::DecodePicture> pictures;
  std::vector<int> logit_rows, logit_slot;
  std::vector<float> logits;
  const auto done = [&](Slot& slot) {
    if (on_done) on_done(size_t(slot.request), out[size_t(slot.request)]);
    slot.request = -1;
  };
  while (true) {
    rows.clear();
    pictures.clear();
    logit_rows.clear();
    logit_slot.clear();
    for (int b = 0; b < batch_; ++b) {
      Slot& slot = slots[size_t(b)];
      if (slot.request < 0 && !waiting.empty()) {
        // A new sequence: its prompt, the last max_len - 1 tokens of it, from position 0.
        const size_t r = waiting.front();
        waiting.pop_front();
        const std::vector<int32_t>& prompt = requests[r].prompt;
        if (prompt.empty()) throw std::invalid_argument("Generator: an empty prompt");
        const size_t n = std::min(prompt.size(), size_t(max_len - 1));
        out[r].prompt_truncated = n < prompt.size();
        if (out[r].prompt_truncated && !requests[r].pictures.empty())
          throw std::invalid_argument("Generator: a prompt with pictures is longer than the cache");
        for (const PromptPicture& p : requests[r].pictures)
          pictures.push_back({int(rows.size() + p.at), p.rgb});
        for (size_t i = 0; i < n; ++i) rows.push_back({b, int32_t(i), prompt[prompt.size() - n + i]});
        slot = {int64_t(r), int(n), 0};
        stats_.prompt_tokens += int64_t(n);
        ++stats_.sequences;
      } else if (slot.request >= 0) {
        rows.push_back({b, slot.position++, slot.next});
      } else {
        continue;
      }
      logit_rows.push_back(int(rows.size()) - 1);
      logit_slot.push_back(b);
    }
    // Under expert parallelism the group's ranks decode other sequences in step: one that has run out
    // decodes no rows until all have.
    if (!model_.decoding(!rows.empty())) break;
    logits.resize(logit_rows.size() * size_t(V));
    model_.decode(cache_, rows, logit_rows, logits, pictures);
    for (size_t i = 0; i < logit_slot.size(); ++i) {
      Slot& slot = slots[size_t(logit_slot[i])];
      Generation& g = out[size_t(slot.request)];
      const uint64_t key = requests[size_t(slot.request)].key;
      const std::span<const float> row(logits.data() + i * size_t(V), size_t(V));
      const int32_t token = pick_token(row, s, sample_draw(s.seed, key, int(g.tokens.size())));
      g.logps.push_back(token_logp(row, token));
      if (std::find(s.stop_tokens.begin(), s.stop_tokens.end(), token) != s.stop_tokens.end()) {
        g.stopped = true;
        g.stop_token = token;
        done(slot);
        continue;
      }
      g.tokens.push_back(token);
      ++stats_.new_tokens;
      if (s.stop_after && s.stop_after(g.tokens)) {
        g.stopped = true;
        done(slot);
        continue;
      }
      // Fed at the next step, if there is a position left for it.
      if (int(g.tokens.size()) >= s.max_new_tokens || slot.position >= max_len) {
        done(slot);
        continue;
      }
      slot.next = token;
    }
  }
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

std::pair<size_t, size_t> find_stop_string(std::string_view text, std::span<const std::string> stop_strings) {
  std::pair<size_t, size_t> best{std::string_view::npos, std::string_view::npos};
  for (size_t i = 0; i < stop_strings.size(); ++i) {
    if (stop_strings[i].empty()) continue;
    const size_t at = text.find(stop_strings[i]);
    if (at == std::string_view::npos) continue;
    if (at < best.first || (at == best.first && stop_strings[i].size() > stop_strings[best.second].size()))
      best = {at, i};
  }
  return best;
}

}  // namespace forge::gate
