#include "forge/ckpt/slice.h"

#include "forge/common/error.h"

#include <fmt/ranges.h>

namespace forge::ckpt {

namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {{DType::kF32, "f32", 4}, {DType::kBF16, "bf16", 2}, {DType::kF16, "f16", 2},
                                 {DType::kU8, "u8", 1},   {DType::kI32, "i32", 4},   {DType::kI64, "i64", 8}};

const DTypeInfo& info(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d;
  fail(ExitCode::kUsage, "unknown dtype value {}", static_cast<int>(dtype));
}

int64_t product(const std::vector<int64_t>& v, size_t from = 0) {
  int64_t p = 1;
  for (size_t i = from; i < v.size(); ++i) p *= v[i];
  return p;
}

}  // namespace

size_t dtype_size(DType dtype) {
  return info(dtype).size;
}
std::string_view dtype_name(DType dtype) {
  return info(dtype).name;
}

DType parse_dtype(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.dtype;
  fail(ExitCode::kData, "unknown dtype '{}' (known: f32, bf16, f16, u8, i32, i64)", name);
}

Slice Slice::whole(std::string name, std::vector<int64_t> shape, DType dtype) {
  Slice s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.dtype = dtype;
  return s;
}

int64_t Slice::numel() const {
  return product(shape);
}

Slice Slice::normalized() const {
  Slice s = *this;
  const size_t rank = shape.size();
  if (s.name.empty()) fail(ExitCode::kUsage, "a checkpoint tensor has an empty name");
  for (size_t d = 0; d < rank; ++d)
    if (shape[d] < 0) fail(ExitCode::kUsage, "tensor '{}': negative extent in shape {}", name, shape);
  if (s.offset.empty()) s.offset.assign(rank, 0);
  if (s.count.empty()) s.count = shape;
  if (s.offset.size() != rank || s.count.size() != rank)
    fail(ExitCode::kUsage, "tensor '{}': offset {} / count {} do not match its {}-d shape {}", name, s.offset,
         s.count, rank, shape);
  for (size_t d = 0; d < rank; ++d) {
    if (s.offset[d] < 0 || s.count[d] < 0 || s.offset[d] + s.count[d] > shape[d])
      fail(ExitCode::kUsage, "tensor '{}': hyperslab offset {} count {} leaves the shape {} in dimension {}",
           name, s.offset, s.count, shape, d);
  }
  const int64_t slab = product(s.count);
  if (s.end < 0) s.end = slab;
  if (s.begin < 0 || s.begin > s.end || s.end > slab)
    fail(ExitCode::kUsage, "tensor '{}': range [{}, {}) is outside its hyperslab of {} elements", name,
         s.begin, s.end, slab);
  return s;
}

int64_t Slice::elements() const {
  const Slice s = normalized();
  return s.end - s.begin;
}

Json Slice::to_json() const {
  return Json{{"name", name},   {"dtype", dtype_name(dtype)},
              {"shape", shape}, {"offset", offset},
              {"count", count}, {"begin", begin},
              {"end", end}};
}

Slice Slice::from_json(const Json& j) {
  Slice s;
  try {
    s.name = j.at("name").get<std::string>();
    s.dtype = parse_dtype(j.at("dtype").get<std::string>());
    s.shape = j.at("shape").get<std::vector<int64_t>>();
    s.offset = j.at("offset").get<std::vector<int64_t>>();
    s.count = j.at("count").get<std::vector<int64_t>>();
    s.begin = j.at("begin").get<int64_t>();
    s.end = j.at("end").get<int64_t>();
  } catch (const Json::exception& e) {
    fail(ExitCode::kData, "bad slice description {}: {}", j.dump(), e.what());
  }
  return s;
}

std::vector<Run> runs_of(const Slice& slice) {
  const Slice s = slice.normalized();
  std::vector<Run> out;
  if (s.begin == s.end) return out;
  const size_t rank = s.shape.size();
  if (rank == 0) return {Run{0, 1, 0}};
  // Rows of the hyperslab run along the last dimension; walk them in row-major order, clipped to
  // [begin, end) of the hyperslab's flattening.
  const int64_t row_len = s.count[rank - 1];
  std::vector<int64_t> stride(rank, 1);
  for (size_t d = rank - 1; d-- > 0;) stride[d] = stride[d + 1] * s.shape[d + 1];
  const int64_t first_row = s.begin / row_len;
  const int64_t last_row = (s.end - 1) / row_len;
  std::vector<int64_t> idx(rank - 1, 0);  // row coordinates within the hyperslab
  int64_t rem = first_row;
  for (size_t d = rank - 1; d-- > 0;) {
    idx[d] = rem % s.count[d];
    rem /= s.count[d];
  }
  int64_t at = 0;
  for (int64_t row = first_row; row <= last_row; ++row) {
    int64_t base = s.offset[rank - 1];
    for (size_t d = 0; d + 1 < rank; ++d) base += (s.offset[d] + idx[d]) * stride[d];
    const int64_t from = std::max<int64_t>(s.begin - row * row_len, 0);
    const int64_t to = std::min<int64_t>(s.end - row * row_len, row_len);
    const int64_t lo = base + from, hi = base + to;
    if (!out.empty() && out.back().hi == lo)
      out.back().hi = hi;
    else
      out.push_back(Run{lo, hi, at});
    at += to - from;
    for (size_t d = rank - 1; d-- > 0;) {
      if (++idx[d] < s.count[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

std::string coords_of(const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> c(shape.size(), 0);
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 0) break;
    c[d] = flat % shape[d];
    flat /= shape[d];
  }
  return fmt::format("{}", c);
}

}  // namespace forge::ckpt
