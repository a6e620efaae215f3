// SwiGLU (Llama's MLP): the gate and up projections come as one product, row = gate | up, and
// out = silu(gate) x up. silu(g) is taken as g / (1 + exp(-g)), PyTorch's form; exp is fast_exp so that
// the loops vectorize (4 ulp: results within 1e-6 of exact). For g below -87 the clamped exp makes silu
// a few 1e-37 off instead of smaller still.
#include "fast_math.h"
#include "kernels.h"

namespace forge::trainer::cpu {

void swiglu_forward(float* out, const float* in, int N, int H) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const float* gate = in + r * 2 * H;
    const float* up = gate + H;
    float* o = out + r * H;
#pragma omp simd
    for (int c = 0; c < H; ++c) o[c] = gate[c] / (1.0f + fast_exp(-gate[c])) * up[c];
  }
}

// d silu(g) / dg = s (1 + g (1 - s)) with s = sigmoid(g).
void swiglu_backward(float* din, const float* dout, const float* in, int N, int H) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const float* gate = in + r * 2 * H;
    const float* up = gate + H;
    const float* d = dout + r * H;
    float* dgate = din + r * 2 * H;
    float* dup = dgate + H;
#pragma omp simd
    for (int c = 0; c < H; ++c) {
      const float g = gate[c];
      const float s = 1.0f / (1.0f + fast_exp(-g));
      dgate[c] = d[c] * up[c] * (s * (1.0f + g * (1.0f - s)));
      dup[c] = d[c] * (g * s);
    }
  }
}

}  // namespace forge::trainer::cpu
