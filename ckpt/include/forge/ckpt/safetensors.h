// safetensors, the tensor files of Hugging Face models: an 8-byte little-endian header size N, N bytes of
// JSON ({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {string: string}}), then
// the tensors' bytes, little-endian and row-major. A file from outside is memory-mapped and its whole
// header checked before any tensor is used, so a hostile or truncated file is an error, never a crash.
#pragma once

#include "forge/ckpt/slice.h"
#include "forge/common/json.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace forge::ckpt {

// "F32", "BF16", "F16" (the element types models are published in); nothing for another name.
std::optional<DType> parse_safetensors_dtype(std::string_view name);
std::string_view safetensors_dtype_name(DType dtype);

struct SafeTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;  // in the mapping
};

class SafetensorsFile {
 public:
  // Maps `path` and checks: the header size inside the file, a JSON object of tensors, a known dtype,
  // dimensions below 2^62 whose product times the dtype's size is the tensor's byte range, ranges inside
  // the data and neither overlapping nor leaving a hole. forge::Error(kData) naming the file and, where
  // there is one, the tensor; kIo when the file cannot be read.
  static SafetensorsFile open(const std::string& path);
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) = delete;
  SafetensorsFile(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<SafeTensor>& tensors() const { return tensors_; }  // in file order
  const Json& metadata() const { return metadata_; }                   // "__metadata__", or {}
  std::span<const std::byte> header() const;                           // the 8 + N bytes before the data
  uint64_t size() const { return size_; }
  // Drops `t`'s pages from this process's resident memory: reading a model tensor by tensor then costs
  // about one tensor of memory, not the file (the page cache keeps them for others).
  void release(const SafeTensor& t) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  const std::byte* map_ = nullptr;
  uint64_t size_ = 0;
  uint64_t data_at_ = 0;
  std::vector<SafeTensor> tensors_;
  Json metadata_ = Json::object();
};

// A tensor to write: its name, dtype, shape, and what writes its bytes (row-major, little-endian) into a
// buffer of exactly its size.
struct SafeTensorOut {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::function<void(std::span<std::byte>)> fill;
};

// Writes a safetensors file of `tensors` in the given order, the header padded to 8 bytes as the
// reference writer does, `metadata` (string values) as "__metadata__". Not atomic: the caller writes into
// a staging directory. One tensor's bytes are in memory at a time. Returns the file's SHA-256, computed as
// it is written. Throws forge::Error(kIo).
std::string write_safetensors(const std::string& path, const std::vector<SafeTensorOut>& tensors,
                              const Json& metadata = Json::object());

}  // namespace forge::ckpt
