// Deterministic, layout-independent initialization: element i of a logical tensor gets a value that is
// a pure function of (seed, tensor name, i), so a tensor-parallel shard or a pipeline stage draws exactly
// the values the whole model would hold there, whatever the thread count.
#include "forge/common/hash.h"
#include "forge/trainer/model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

namespace forge::trainer {

namespace {

// Standard normal from two counter-based uniforms (Box-Muller).
double normal_at(uint64_t key, uint64_t index) {
  const uint64_t a = splitmix64(key ^ splitmix64(2 * index));
  const uint64_t b = splitmix64(key ^ splitmix64(2 * index + 1));
  const double u1 = (double(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = double(b >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Logical flat index of local flat index `i` of `slice`'s shard of `p`.
uint64_t logical_index(const ParamInfo& p, const ModelSlice& slice, uint64_t i) {
  if (p.shard.kind == ShardRule::Kind::kReplicated || p.local_shape == p.shape) return i;
  if (p.shard.kind == ShardRule::Kind::kExperts) return uint64_t(slice.ep_rank) * p.numel + i;
  const int tp_rank = p.shard.part(slice.tp_rank);
  const size_t dims = p.shape.size();
  uint64_t inner = 1;  // elements per step of the split dimension
  for (size_t d = size_t(p.shard.dim) + 1; d < dims; ++d) inner *= uint64_t(p.shape[d]);
  const uint64_t local_dim = uint64_t(p.local_shape[p.shard.dim]);
  const uint64_t logical_dim = uint64_t(p.shape[p.shard.dim]);
  const uint64_t outer = i / (local_dim * inner), rest = i % (local_dim * inner);
  const uint64_t ld = rest / inner, within = rest % inner;
  const uint64_t local_block = local_dim / uint64_t(p.shard.groups);
  const uint64_t logical_block = logical_dim / uint64_t(p.shard.groups);
  const uint64_t gd = (ld / local_block) * logical_block + uint64_t(tp_rank) * local_block + ld % local_block;
  return (outer * logical_dim + gd) * inner + within;
}

}  // namespace

void init_parameter(const ParamInfo& p, const ModelSlice& slice, uint64_t seed, std::span<float> out) {
  if (out.size() != p.numel) throw std::invalid_argument("init_parameter: " + p.name + ": wrong size");
  if (p.init_std <= 0) {
    std::fill(out.begin(), out.end(), p.init_value);
    return;
  }
  const uint64_t key = xxh3_64(p.name.data(), p.name.size(), seed);
  float* w = out.data();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(p.numel); ++i)
    w[i] = float(p.init_std * normal_at(key, logical_index(p, slice, uint64_t(i))));
}

}  // namespace forge::trainer
