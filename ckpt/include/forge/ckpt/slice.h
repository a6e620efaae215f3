// Pieces of logical tensors. A checkpoint stores every tensor in its logical (unsharded) coordinates, so
// a checkpoint written on one parallel layout loads on another: a rank names the part it holds as a
// hyperslab (offset[]/count[] in logical coordinates) and, for flat-range sharding such as ZeRO-1, a
// contiguous [begin, end) range of that hyperslab's row-major flattening. Data are row-major.
#pragma once

#include "forge/common/json.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace forge::ckpt {

// Stored per tensor, so new element types need no format change. No conversion happens on load.
enum class DType { kF32, kBF16, kF16, kU8, kI32, kI64 };
size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // "f32", "bf16", "f16", "u8", "i32", "i64"
DType parse_dtype(std::string_view name);  // throws forge::Error(kData)

struct Slice {
  std::string name;  // namespaced by kind: "param/blocks.3.attn.qkv.weight", "adam_m/...", "adam_v/..."
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;   // logical shape ([] is a scalar)
  std::vector<int64_t> offset;  // hyperslab start; empty: all zeros
  std::vector<int64_t> count;   // hyperslab extent; empty: the whole shape
  int64_t begin = 0;            // range of the hyperslab's row-major flattening
  int64_t end = -1;             // -1: to the end of the hyperslab

  // The whole logical tensor (offset, count and end left to their defaults, so they may be set after).
  static Slice whole(std::string name, std::vector<int64_t> shape, DType dtype = DType::kF32);

  // Fills defaults (offset zeros, count = shape, end = hyperslab size) and checks bounds; throws
  // forge::Error(kUsage) naming the tensor and the bad coordinate.
  Slice normalized() const;
  int64_t numel() const;     // elements of the logical tensor
  int64_t elements() const;  // elements of this piece (normalized)
  size_t bytes() const { return static_cast<size_t>(elements()) * dtype_size(dtype); }

  Json to_json() const;  // geometry only (name, dtype, shape, offset, count, begin, end)
  static Slice from_json(const Json& j);
};

// A run of the piece's elements: logical row-major indices [lo, hi) of the tensor, which sit at element
// `at` of the piece's own buffer. A row-major walk of a hyperslab visits logical indices in increasing
// order, so a piece is a sorted list of disjoint runs and its buffer is those runs back to back.
struct Run {
  int64_t lo = 0;
  int64_t hi = 0;
  int64_t at = 0;
};

// The runs of a (normalized) slice, adjacent runs merged.
std::vector<Run> runs_of(const Slice& slice);

// Calls fn(lo, hi, at_a, at_b) for every maximal interval that both run lists cover.
template <typename Fn>
void intersect_runs(const std::vector<Run>& a, const std::vector<Run>& b, Fn&& fn) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t lo = std::max(a[i].lo, b[j].lo);
    const int64_t hi = std::min(a[i].hi, b[j].hi);
    if (lo < hi) fn(lo, hi, a[i].at + (lo - a[i].lo), b[j].at + (lo - b[j].lo));
    if (a[i].hi < b[j].hi)
      ++i;
    else
      ++j;
  }
}

// "[3, 17]": a logical flat index as coordinates, for error messages.
std::string coords_of(const std::vector<int64_t>& shape, int64_t flat);

}  // namespace forge::ckpt
