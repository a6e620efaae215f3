// Rotary position embeddings (RoPE): the frequencies each pair of a head's dimensions turns at, for the
// scalings released models use. Backend::rope applies them to q and k.
#pragma once

#include <vector>

namespace forge::trainer {

// How the frequencies are stretched for contexts longer than the model was pretrained on
// (model.rope_scaling): none; linear (position interpolation: every frequency / factor); llama3 (Llama 3.1:
// low frequencies / factor, high ones kept, a smooth ramp between); yarn (NTK-by-parts with YaRN's
// attention factor).
enum class RopeScaling { kNone, kLinear, kLlama3, kYarn };

struct RopeSpec {
  double theta = 10000;  // base: inv_freq[i] = theta^(-2i / head_dim) before scaling
  RopeScaling scaling = RopeScaling::kNone;
  double factor = 1;                     // linear, llama3, yarn: how much longer the context is
  double low_freq_factor = 1;            // llama3
  double high_freq_factor = 4;           // llama3
  int original_positions = 8192;         // llama3, yarn: the context the model was pretrained on
  double beta_fast = 32, beta_slow = 1;  // yarn: the rotation counts bounding the ramp
};

// What Backend::rope multiplies by: head_dim / 2 inverse frequencies and the magnitude of the rotated
// values (YaRN's attention factor 0.1 ln(factor) + 1; 1 for the other scalings). Computed in double from
// the formulas of Hugging Face's rope initialisation functions, then rounded to float (theirs compute in
// float32: up to 3e-7 relative apart).
struct RopeTable {
  std::vector<float> inv_freq;
  float magnitude = 1;
};
RopeTable rope_table(const RopeSpec& spec, int head_dim);

}  // namespace forge::trainer
