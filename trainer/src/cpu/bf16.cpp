// BF16 rounding: the upper 16 bits of an fp32 value after round-to-nearest-even on the lower 16; and the
// 2-byte storage of such values.
#include "kernels.h"

#include <cstring>

namespace forge::trainer::cpu {

namespace {
inline float round_one(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7f800000u) != 0x7f800000u) {
    bits += 0x7fffu + ((bits >> 16) & 1u);  // finite: round to nearest, ties to even
  } else if ((bits & 0x007fffffu) != 0) {
    bits |= 0x00400000u;  // NaN stays NaN (quiet) after truncation
  }
  bits &= 0xffff0000u;
  std::memcpy(&x, &bits, 4);
  return x;
}
}  // namespace

void round_to_bf16(float* out, const float* in, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = round_one(in[i]);
}

void round_to_bf16(float* data, int64_t n) {
  round_to_bf16(data, data, n);
}

void to_bf16(uint16_t* out, float* values, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    values[i] = round_one(values[i]);
    uint32_t bits;
    std::memcpy(&bits, values + i, 4);
    out[i] = uint16_t(bits >> 16);
  }
}

void to_bf16(uint16_t* out, const float* values, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    const float rounded = round_one(values[i]);
    std::memcpy(&bits, &rounded, 4);
    out[i] = uint16_t(bits >> 16);
  }
}

void from_bf16(float* out, const uint16_t* in, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = widen(in[i]);
}

}  // namespace forge::trainer::cpu
