// The classifier fused with cross-entropy, in chunks of rows: one chunk's logits (FP32) are formed by
// cuBLASLt, turned into per-row losses and their gradient (type T) by one kernel, and consumed by the two
// backward products before the next chunk. At GPT-2 scale (vocab 50304) a chunk of 1024 rows is 200 MiB of
// logits, against 3 GiB for all 16 K rows of a batch.
#include "forge/trainer/cuda/context.h"
#include "forge/trainer/cuda/ops.h"

#include <algorithm>
#include <vector>

namespace forge::trainer::cuda {

namespace {
constexpr int kChunkRows = 1024;

struct Scratch {
  DeviceBuffer logits, dlogits, losses;
};

template <class T>
Scratch& scratch(int rows, int V, int N) {
  static Scratch s;
  const size_t need = size_t(rows) * size_t(V);
  if (s.logits.bytes() < need * sizeof(float)) s.logits = DeviceBuffer(need * sizeof(float));
  if (s.dlogits.bytes() < need * sizeof(T)) s.dlogits = DeviceBuffer(need * sizeof(T));
  if (s.losses.bytes() < size_t(N) * sizeof(float)) s.losses = DeviceBuffer(size_t(N) * sizeof(float));
  return s;
}
}  // namespace

template <class T>
double classifier_forward_backward(T* dx, float* dwte, const T* x, const T* wte, const int32_t* targets,
                                   int N, int C, int V, float grad_scale) {
  const int chunk = std::min(N, kChunkRows);
  Scratch& s = scratch<T>(chunk, V, N);
  for (int r0 = 0; r0 < N; r0 += chunk) {
    const int rows = std::min(chunk, N - r0);
    matmul_forward<T, float>(s.logits.as<float>(), x + int64_t(r0) * C, wte, nullptr, rows, C, V);
    cross_entropy_rows<T>(dx != nullptr ? s.dlogits.as<T>() : nullptr, s.losses.as<float>() + r0,
                          s.logits.as<float>(), targets + r0, rows, V, grad_scale);
    if (dx != nullptr)
      matmul_backward<T>(dx + int64_t(r0) * C, dwte, nullptr, s.dlogits.as<T>(), x + int64_t(r0) * C, wte,
                         rows, C, V);
  }
  // One copy (and one synchronization) per call, not per chunk.
  std::vector<float> losses(static_cast<size_t>(N));
  to_host(losses.data(), s.losses.as<float>(), sizeof(float) * size_t(N));
  double total = 0;
  for (float l : losses) total += l;
  return total;
}

template double classifier_forward_backward<float>(float*, float*, const float*, const float*, const int32_t*,
                                                   int, int, int, float);
template double classifier_forward_backward<bf16>(bf16*, float*, const bf16*, const bf16*, const int32_t*,
                                                  int, int, int, float);

}  // namespace forge::trainer::cuda
