#include "forge/common/batch.h"

#include "forge/common/error.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace forge {

namespace {

// Serialized form: magic, rows, seq_len, which optional fields follow, then the arrays in field order.
constexpr char kMagic[8] = {'F', 'M', 'B', 'A', 'T', 'C', 'H', '1'};
constexpr uint32_t kHasWeights = 1, kHasPositions = 2, kHasSegments = 4, kHasReference = 8, kHasDomains = 16,
                   kHasRollout = 32, kHasRolloutReference = 64, kHasImages = 128, kHasPpo = 256,
                   kHasOldValues = 512;

template <typename T>
void put(std::string& out, const std::vector<T>& v) {
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename T>
void take(std::string_view& in, std::vector<T>& v, size_t n) {
  if (in.size() < n * sizeof(T)) fail(ExitCode::kData, "serialized micro-batch is truncated");
  v.resize(n);
  if (n != 0) std::memcpy(v.data(), in.data(), n * sizeof(T));  // an empty vector's data() may be null
  in.remove_prefix(n * sizeof(T));
}

template <typename T>
void append_rows(std::vector<T>& out, const std::vector<T>& in, size_t first, size_t count) {
  out.insert(out.end(), in.begin() + int64_t(first), in.begin() + int64_t(first + count));
}

// A row's next-token targets: its T inputs shifted by one, then `next`.
void shift_row(const int32_t* inputs, size_t T, int32_t next, int32_t* targets) {
  std::copy_n(inputs + 1, T - 1, targets);
  targets[T - 1] = next;
}

}  // namespace

void MicroBatch::resize(int r, int t, Targets form) {
  rows = r;
  seq_len = t;
  inputs.resize(size());
  if (form == Targets::kExplicit) {
    targets.resize(size());
    next_tokens.clear();
  } else {
    targets.clear();
    next_tokens.resize(size_t(r));
  }
  sample_ids.resize(size_t(r));
  epochs.resize(size_t(r));
  weights.clear();
  positions.clear();
  segments.clear();
  domains.clear();
  reference_logps.clear();
  advantages.clear();
  old_logps.clear();
  ref_logps.clear();
  rewards.clear();
  old_values.clear();
  image_pixels.clear();
  image_starts.clear();
}

void MicroBatch::add_image(int r, int t, const uint8_t* rgb) {
  image_starts.push_back(int64_t(r) * seq_len + t);
  image_pixels.insert(image_pixels.end(), rgb, rgb + image_bytes());
}

double MicroBatch::weight_sum() const {
  double sum = 0;
  for (size_t i = 0; i < size(); ++i) sum += weight(i);
  return sum;
}

void MicroBatch::copy_targets(int32_t* out) const {
  if (form() == Targets::kExplicit) {
    std::copy(targets.begin(), targets.end(), out);
    return;
  }
  const size_t T = size_t(seq_len);
  for (size_t r = 0; r < size_t(rows); ++r) shift_row(inputs.data() + r * T, T, next_tokens[r], out + r * T);
}

void MicroBatch::materialize_targets() {
  if (form() == Targets::kExplicit) return;
  std::vector<int32_t> out(size());  // copy_targets reads the form from `targets` being empty
  copy_targets(out.data());
  targets = std::move(out);
  next_tokens.clear();
}

void MicroBatch::set_next_token(int r, int32_t next) {
  if (form() == Targets::kNextToken) {
    next_tokens[size_t(r)] = next;
    return;
  }
  const size_t T = size_t(seq_len), at = size_t(r) * T;
  shift_row(inputs.data() + at, T, next, targets.data() + at);
}

void MicroBatch::set_window(int r, const int32_t* window, uint64_t sample_id, uint32_t epoch) {
  const size_t T = size_t(seq_len), at = size_t(r) * T;
  std::copy(window, window + T, inputs.begin() + int64_t(at));
  set_next_token(r, window[T]);
  sample_ids[size_t(r)] = sample_id;
  epochs[size_t(r)] = epoch;
}

void MicroBatch::set_documents(int r, std::span<const int32_t> starts) {
  materialize_targets();
  if (segments.empty()) {
    weights.assign(size(), 1.0f);
    positions.resize(size());
    segments.assign(size(), 0);
    for (size_t i = 0; i < size(); ++i) positions[i] = int32_t(i % size_t(seq_len));
  }
  const size_t at = size_t(r) * size_t(seq_len);
  size_t next = 0;
  int32_t segment = 0, start = 0;
  for (int32_t t = 0; t < seq_len; ++t) {
    while (next < starts.size() && starts[next] <= t) {
      start = starts[next++];
      ++segment;
    }
    positions[at + size_t(t)] = t - start;
    segments[at + size_t(t)] = segment;
    // Position t predicts window token t + 1: not scored when that token opens the next document.
    if (next < starts.size() && starts[next] == t + 1) {
      targets[at + size_t(t)] = kIgnore;
      weights[at + size_t(t)] = 0.0f;
    }
  }
}

std::optional<std::string> MicroBatch::problem(int vocab, int max_positions) const {
  const size_t n = size();
  const auto where = [&](size_t i, const std::string& what) {
    const size_t r = i / size_t(seq_len);
    return fmt::format("sample {} (row {}, position {}): {}", r < sample_ids.size() ? sample_ids[r] : 0, r,
                       i % size_t(seq_len), what);
  };
  const bool next_token = form() == Targets::kNextToken;
  if (inputs.size() != n || (next_token ? next_tokens.size() != size_t(rows) : targets.size() != n) ||
      sample_ids.size() != size_t(rows) || (!weights.empty() && weights.size() != n) ||
      (!positions.empty() && positions.size() != n) || (!segments.empty() && segments.size() != n) ||
      (!domains.empty() && domains.size() != size_t(rows)) ||
      (!advantages.empty() && (advantages.size() != size_t(rows) || old_logps.size() != n)) ||
      (!rewards.empty() && (rewards.size() != size_t(rows) || old_logps.size() != n)) ||
      (!advantages.empty() && !rewards.empty()) || (rewards.empty() && !old_values.empty()) ||
      (!old_values.empty() && old_values.size() != n) ||
      (advantages.empty() && rewards.empty() && !old_logps.empty()) ||
      (!ref_logps.empty() && ref_logps.size() != n))
    return fmt::format("a micro-batch of {} x {} positions has fields of the wrong length", rows, seq_len);
  if (image_pixels.size() != images() * image_bytes() || (images() > 0 && image_tokens <= 0))
    return fmt::format("{} pictures of {}x{} with {} bytes of pixels and {} positions each", images(),
                       image_size, image_size, image_pixels.size(), image_tokens);
  for (size_t k = 0; k < images(); ++k) {
    const int64_t at = image_starts[k], T = seq_len;
    if (at < 0 || size_t(at) >= n || at % T + image_tokens > T ||
        (k > 0 && at < image_starts[k - 1] + image_tokens))
      return where(size_t(std::clamp<int64_t>(at, 0, int64_t(n) - 1)),
                   fmt::format("picture {}'s {} positions leave the row or overlap the previous picture's", k,
                               image_tokens));
  }
  for (size_t i = 0; i < n; ++i) {
    if (inputs[i] < 0 || inputs[i] >= vocab)
      return where(i, fmt::format("input id {} is outside the vocabulary [0, {})", inputs[i], vocab));
    const int32_t target = this->target(i);
    if (target != kIgnore && (target < 0 || target >= vocab))
      return where(i, fmt::format("target id {} is outside the vocabulary [0, {})", target, vocab));
    if (!weights.empty() && !(std::isfinite(weights[i]) && weights[i] >= 0))
      return where(i, fmt::format("loss weight {} is not a finite value >= 0", weights[i]));
    if (!reference_logps.empty() && i % size_t(seq_len) == 0) {
      const size_t r = i / size_t(seq_len);
      if (segments.empty() || reference_logps.size() != 2 * size_t(rows))
        return where(i,
                     "a batch of preference pairs needs documents and two reference log-probabilities a row");
      for (const double lp : {reference_logps[2 * r], reference_logps[2 * r + 1]})
        if (!(std::isfinite(lp) && lp <= 0))
          return where(i, fmt::format("reference log-probability {} is not a finite value <= 0", lp));
    }
    if (!advantages.empty() && i % size_t(seq_len) == 0 && !std::isfinite(advantages[i / size_t(seq_len)]))
      return where(i, fmt::format("advantage {} is not finite", advantages[i / size_t(seq_len)]));
    if (!rewards.empty() && i % size_t(seq_len) == 0 && !std::isfinite(rewards[i / size_t(seq_len)]))
      return where(i, fmt::format("reward {} is not finite", rewards[i / size_t(seq_len)]));
    if (!old_values.empty() && !std::isfinite(old_values[i]))
      return where(i, fmt::format("value {} is not finite", old_values[i]));
    for (const auto* logps : {&old_logps, &ref_logps})
      if (!logps->empty() && !(std::isfinite((*logps)[i]) && (*logps)[i] <= 0))
        return where(i, fmt::format("log-probability {} is not a finite value <= 0", (*logps)[i]));
    const int32_t pos = positions.empty() ? int32_t(i % size_t(seq_len)) : positions[i];
    if (pos < 0 || pos >= max_positions)
      return where(i, fmt::format("position {} is outside [0, {})", pos, max_positions));
    if (!segments.empty()) {
      const bool row_start = i % size_t(seq_len) == 0;
      const int32_t before = row_start ? 0 : segments[i - 1];
      if (segments[i] != before && segments[i] != before + 1)
        return where(i, fmt::format("document id {} after {}: ids must count up from 0 in each row",
                                    segments[i], before));
    }
  }
  return std::nullopt;
}

MicroBatch MicroBatch::slice_rows(int first, int count) const {
  MicroBatch out;
  out.rows = count;
  out.seq_len = seq_len;
  const size_t T = size_t(seq_len), lo = size_t(first) * T, n = size_t(count) * T;
  append_rows(out.inputs, inputs, lo, n);
  if (!targets.empty()) append_rows(out.targets, targets, lo, n);
  if (!next_tokens.empty()) append_rows(out.next_tokens, next_tokens, size_t(first), size_t(count));
  if (!weights.empty()) append_rows(out.weights, weights, lo, n);
  if (!positions.empty()) append_rows(out.positions, positions, lo, n);
  if (!segments.empty()) append_rows(out.segments, segments, lo, n);
  append_rows(out.sample_ids, sample_ids, size_t(first), size_t(count));
  append_rows(out.epochs, epochs, size_t(first), size_t(count));
  if (!domains.empty()) append_rows(out.domains, domains, size_t(first), size_t(count));
  if (!reference_logps.empty())
    append_rows(out.reference_logps, reference_logps, 2 * size_t(first), 2 * size_t(count));
  if (!advantages.empty()) append_rows(out.advantages, advantages, size_t(first), size_t(count));
  if (!old_logps.empty()) append_rows(out.old_logps, old_logps, lo, n);
  if (!ref_logps.empty()) append_rows(out.ref_logps, ref_logps, lo, n);
  if (!rewards.empty()) append_rows(out.rewards, rewards, size_t(first), size_t(count));
  if (!old_values.empty()) append_rows(out.old_values, old_values, lo, n);
  out.image_size = image_size;
  out.image_tokens = image_tokens;
  for (size_t k = 0; k < images(); ++k)
    if (size_t(image_starts[k]) >= lo && size_t(image_starts[k]) < lo + n) {
      out.image_starts.push_back(image_starts[k] - int64_t(lo));
      append_rows(out.image_pixels, image_pixels, k * image_bytes(), image_bytes());
    }
  return out;
}

MicroBatch MicroBatch::concat(std::span<const MicroBatch> parts) {
  MicroBatch out;
  if (parts.empty()) return out;
  out.seq_len = parts[0].seq_len;
  bool weights = false, positions = false, segments = false, explicit_targets = false;
  // Domains have no default: the result knows them only when every part does.
  bool domains = true;
  for (const MicroBatch& p : parts) {
    if (p.seq_len != out.seq_len) throw std::invalid_argument("MicroBatch::concat: seq_len differs");
    domains = domains && p.domains.size() == size_t(p.rows);
    weights = weights || !p.weights.empty();
    positions = positions || !p.positions.empty();
    segments = segments || !p.segments.empty();
    explicit_targets = explicit_targets || p.form() == Targets::kExplicit;
  }
  for (const MicroBatch& p : parts) {
    out.rows += p.rows;
    append_rows(out.inputs, p.inputs, 0, p.size());
    if (!explicit_targets) append_rows(out.next_tokens, p.next_tokens, 0, size_t(p.rows));
    append_rows(out.sample_ids, p.sample_ids, 0, size_t(p.rows));
    append_rows(out.epochs, p.epochs, 0, size_t(p.rows));
    if (domains) append_rows(out.domains, p.domains, 0, size_t(p.rows));
    if (p.reference_logps.size() != (parts[0].reference_logps.empty() ? 0 : 2 * size_t(p.rows)))
      throw std::invalid_argument("MicroBatch::concat: preference pairs mixed with other rows");
    append_rows(out.reference_logps, p.reference_logps, 0, p.reference_logps.size());
    if (p.advantages.empty() != parts[0].advantages.empty() ||
        p.rewards.empty() != parts[0].rewards.empty() ||
        p.old_values.empty() != parts[0].old_values.empty() ||
        p.ref_logps.empty() != parts[0].ref_logps.empty())
      throw std::invalid_argument("MicroBatch::concat: sampled replies mixed with other rows");
    append_rows(out.advantages, p.advantages, 0, p.advantages.size());
    append_rows(out.old_logps, p.old_logps, 0, p.old_logps.size());
    append_rows(out.ref_logps, p.ref_logps, 0, p.ref_logps.size());
    append_rows(out.rewards, p.rewards, 0, p.rewards.size());
    append_rows(out.old_values, p.old_values, 0, p.old_values.size());
    if (p.images() > 0) {
      if (out.images() > 0 && (p.image_size != out.image_size || p.image_tokens != out.image_tokens))
        throw std::invalid_argument("MicroBatch::concat: pictures of different sizes");
      out.image_size = p.image_size;
      out.image_tokens = p.image_tokens;
      for (const int64_t at : p.image_starts) out.image_starts.push_back(at + int64_t(out.size() - p.size()));
      append_rows(out.image_pixels, p.image_pixels, 0, p.image_pixels.size());
    }
    // A part without an optional field contributes its default values.
    for (size_t i = 0; i < p.size(); ++i) {
      if (explicit_targets) out.targets.push_back(p.target(i));
      if (weights) out.weights.push_back(p.weights.empty() ? 1.0f : p.weights[i]);
      if (positions)
        out.positions.push_back(p.positions.empty() ? int32_t(i % size_t(p.seq_len)) : p.positions[i]);
      if (segments) out.segments.push_back(p.segments.empty() ? 0 : p.segments[i]);
    }
  }
  return out;
}

std::string MicroBatch::serialize() const {
  std::string out(kMagic, sizeof kMagic);
  const uint32_t flags =
      (weights.empty() ? 0 : kHasWeights) | (positions.empty() ? 0 : kHasPositions) |
      (segments.empty() ? 0 : kHasSegments) | (reference_logps.empty() ? 0 : kHasReference) |
      (domains.empty() ? 0 : kHasDomains) | (advantages.empty() ? 0 : kHasRollout) |
      (ref_logps.empty() ? 0 : kHasRolloutReference) | (image_starts.empty() ? 0 : kHasImages) |
      (rewards.empty() ? 0 : kHasPpo) | (old_values.empty() ? 0 : kHasOldValues);
  const uint32_t header[3] = {uint32_t(rows), uint32_t(seq_len), flags};
  out.append(reinterpret_cast<const char*>(header), sizeof header);
  put(out, inputs);
  std::vector<int32_t> explicit_targets(size());  // the same bytes in either form
  copy_targets(explicit_targets.data());
  put(out, explicit_targets);
  put(out, weights);
  put(out, positions);
  put(out, segments);
  put(out, sample_ids);
  put(out, epochs);
  put(out, reference_logps);
  put(out, domains);  // after the older fields: bytes written before a field existed read back without it
  put(out, advantages);
  put(out, old_logps);
  put(out, ref_logps);
  if (!image_starts.empty()) {
    put(out, std::vector<int64_t>{image_size, image_tokens, int64_t(images())});
    put(out, image_starts);
    put(out, image_pixels);
  }
  put(out, rewards);  // after the pictures: the bytes written before PPO read back as they were
  put(out, old_values);
  return out;
}

MicroBatch MicroBatch::deserialize(std::string_view in) {
  uint32_t header[3];
  if (in.size() < sizeof kMagic + sizeof header || std::memcmp(in.data(), kMagic, sizeof kMagic) != 0)
    fail(ExitCode::kData, "not a serialized micro-batch (bad magic)");
  in.remove_prefix(sizeof kMagic);
  std::memcpy(header, in.data(), sizeof header);
  in.remove_prefix(sizeof header);
  MicroBatch b;
  b.rows = int(header[0]);
  b.seq_len = int(header[1]);
  const size_t n = b.size();
  take(in, b.inputs, n);
  take(in, b.targets, n);
  take(in, b.weights, header[2] & kHasWeights ? n : 0);
  take(in, b.positions, header[2] & kHasPositions ? n : 0);
  take(in, b.segments, header[2] & kHasSegments ? n : 0);
  take(in, b.sample_ids, size_t(b.rows));
  take(in, b.epochs, size_t(b.rows));
  take(in, b.reference_logps, header[2] & kHasReference ? 2 * size_t(b.rows) : 0);
  take(in, b.domains, header[2] & kHasDomains ? size_t(b.rows) : 0);
  take(in, b.advantages, header[2] & kHasRollout ? size_t(b.rows) : 0);
  take(in, b.old_logps, header[2] & (kHasRollout | kHasPpo) ? n : 0);
  take(in, b.ref_logps, header[2] & kHasRolloutReference ? n : 0);
  if (header[2] & kHasImages) {
    std::vector<int64_t> shape;
    take(in, shape, 3);
    if (shape[0] <= 0 || shape[0] > 4096 || shape[1] <= 0 || shape[2] <= 0 || size_t(shape[2]) > n)
      fail(ExitCode::kData, "serialized micro-batch has a bad picture header");
    b.image_size = int(shape[0]);
    b.image_tokens = int(shape[1]);
    take(in, b.image_starts, size_t(shape[2]));
    take(in, b.image_pixels, size_t(shape[2]) * b.image_bytes());
  }
  take(in, b.rewards, header[2] & kHasPpo ? size_t(b.rows) : 0);
  take(in, b.old_values, header[2] & kHasOldValues ? n : 0);
  if (!in.empty()) fail(ExitCode::kData, "serialized micro-batch has {} trailing bytes", in.size());
  return b;
}

}  // namespace forge
