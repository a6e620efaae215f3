// Rotary position embeddings on the q and k heads of qkv rows, rotate-half convention (Hugging Face's
// apply_rotary_pos_emb): the pair (x[i], x[i + head_dim/2]) turns by position x inv_freq[i].
//
// Rounding follows Hugging Face in FP32: the angle is float(position) x inv_freq[i] rounded to float
// (their position-by-frequency product), its cos and sin are taken in float and multiplied by the
// magnitude (their attention_scaling) before the rotation. At positions in the thousands the float angle
// is off by up to 1e-4 radians; computing it in double would be more exact and differ from the released
// models' own arithmetic by that much.
#include "kernels.h"

#include <cmath>
#include <memory>

namespace forge::trainer::cpu {

void rope(float* qkv, const int32_t* positions, const float* inv_freq, float magnitude, int N, int T,
          const AttentionShape& shape, bool inverse) {
  const int half = shape.head_dim / 2, heads = shape.heads + shape.kv_heads, W = shape.qkv_width();
  // The backward turns by -angle: R(-a) = R(a)^T.
  const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel
  {
    // cos and sin of the row's angles, shared by all of its heads.
    const auto table = std::make_unique_for_overwrite<float[]>(2 * size_t(half));
    float* cs = table.get();
    float* sn = cs + half;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
      const float p = float(positions != nullptr ? positions[r] : int32_t(r % T));
      for (int i = 0; i < half; ++i) {
        const float angle = p * inv_freq[i];
        cs[i] = std::cos(angle) * magnitude;
        sn[i] = sign * std::sin(angle) * magnitude;
      }
      for (int h = 0; h < heads; ++h) {
        float* x = qkv + r * W + h * shape.head_dim;
#pragma omp simd
        for (int i = 0; i < half; ++i) {
          const float x1 = x[i], x2 = x[i + half];
          x[i] = x1 * cs[i] - x2 * sn[i];
          x[i + half] = x2 * cs[i] + x1 * sn[i];
        }
      }
    }
  }
}

}  // namespace forge::trainer::cpu
