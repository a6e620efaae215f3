// RoPE frequency tables for the scalings of released models, each as Hugging Face's modeling_rope_utils
// computes it (_compute_default/linear_scaling/llama3/yarn_parameters), so that checkpoints trained
// with their frequencies keep them here. HF computes the base frequencies in FP32; these are computed in
// double and rounded once, which agrees with theirs to about 1e-7 relative.
#include "forge/trainer/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

namespace forge::trainer {

namespace {

// Llama 3.1: wavelengths longer than original_positions / low_freq_factor are stretched by factor, those
// shorter than original_positions / high_freq_factor kept, and the band between blended smoothly.
double llama3(double inv, const RopeSpec& s) {
  const double wavelen = 2 * std::numbers::pi / inv;
  const double low_freq_wavelen = s.original_positions / s.low_freq_factor;
  const double high_freq_wavelen = s.original_positions / s.high_freq_factor;
  if (wavelen > low_freq_wavelen) return inv / s.factor;
  if (wavelen < high_freq_wavelen) return inv;
  const double smooth =
      (s.original_positions / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1 - smooth) * inv / s.factor + smooth * inv;
}

// YaRN's "NTK-by-parts": dimensions that turn fewer than beta_slow times over the original context are
// interpolated (/ factor), those turning more than beta_fast times kept, a linear ramp between. The
// bounds are floored and ceiled as in Hugging Face before their `truncate` option.
void yarn(std::vector<float>& out, const std::vector<double>& inv, const RopeSpec& s, int head_dim) {
  const auto correction_dim = [&](double rotations) {
    return head_dim * std::log(s.original_positions / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(s.theta));
  };
  const double low = std::max(std::floor(correction_dim(s.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(s.beta_slow)), double(head_dim - 1));
  if (low == high) high += 0.001;  // as HF: avoids dividing by zero
  for (size_t i = 0; i < inv.size(); ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation_factor = 1 - ramp;
    const double interpolation = inv[i] / s.factor;
    out[i] = float(interpolation * (1 - extrapolation_factor) + inv[i] * extrapolation_factor);
  }
}

}  // namespace

RopeTable rope_table(const RopeSpec& spec, int head_dim) {
  if (head_dim <= 0 || head_dim % 2 != 0)
    throw std::invalid_argument("rope: head_dim must be positive and even, got " + std::to_string(head_dim));
  if (!(spec.theta > 0)) throw std::invalid_argument("rope: theta must be positive");
  if (spec.scaling != RopeScaling::kNone && !(spec.factor > 0))
    throw std::invalid_argument("rope: the scaling factor must be positive");

  const int half = head_dim / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) inv[size_t(i)] = 1.0 / std::pow(spec.theta, 2.0 * i / head_dim);

  RopeTable table;
  table.inv_freq.resize(size_t(half));
  switch (spec.scaling) {
    case RopeScaling::kNone:
      for (int i = 0; i < half; ++i) table.inv_freq[size_t(i)] = float(inv[size_t(i)]);
      break;
    case RopeScaling::kLinear:
      for (int i = 0; i < half; ++i) table.inv_freq[size_t(i)] = float(inv[size_t(i)] / spec.factor);
      break;
    case RopeScaling::kLlama3:
      for (int i = 0; i < half; ++i) table.inv_freq[size_t(i)] = float(llama3(inv[size_t(i)], spec));
      break;
    case RopeScaling::kYarn:
      yarn(table.inv_freq, inv, spec, head_dim);
      table.magnitude = spec.factor <= 1 ? 1.0f : float(0.1 * std::log(spec.factor) + 1);
      break;
  }
  return table;
}

}  // namespace forge::trainer
