#include "forge/ckpt/safetensors.h"

#include "fs.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>

namespace forge::ckpt {

namespace {

// The reference reader's limit: a header this large is not a model's.
constexpr uint64_t kMaxHeader = 100ull << 20;
constexpr uint64_t kMaxDim = 1ull << 62;

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace

std::optional<DType> parse_safetensors_dtype(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  return std::nullopt;
}

std::string_view safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kU8:
      return "U8";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
  }
  return "?";
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) fail(ExitCode::kIo, "cannot read '{}': {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) fail(ExitCode::kIo, "cannot stat '{}': {}", path, std::strerror(errno));
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (f.size_ < 8)
    fail(ExitCode::kData, "{}: {} bytes, too short for a safetensors file (an 8-byte header size first)",
         path, f.size_);
  void* m = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (m == MAP_FAILED) fail(ExitCode::kIo, "cannot map '{}': {}", path, std::strerror(errno));
  f.map_ = static_cast<const std::byte*>(m);
  ::madvise(m, f.size_, MADV_SEQUENTIAL);

  const uint64_t n = read_le64(f.map_);
  if (n > f.size_ - 8 || n > kMaxHeader)
    fail(ExitCode::kData, "{}: the header claims {} bytes, but the file has {} after the size field{}", path,
         n, f.size_ - 8, n > kMaxHeader ? " (and the limit is 100 MiB)" : "");
  f.data_at_ = 8 + n;
  const uint64_t data_size = f.size_ - f.data_at_;
  Json header;
  try {
    header = Json::parse(std::string_view(reinterpret_cast<const char*>(f.map_ + 8), n));
  } catch (const Json::exception& e) {
    fail(ExitCode::kData, "{}: the header is not JSON: {}", path, e.what());
  }
  if (!header.is_object()) fail(ExitCode::kData, "{}: the header is not a JSON object", path);

  struct Range {
    uint64_t begin, end;
    size_t tensor;
  };
  std::vector<Range> ranges;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__") {
      if (!t.is_object()) fail(ExitCode::kData, "{}: __metadata__ is not an object", path);
      f.metadata_ = t;
      continue;
    }
    const auto bad = [&](const std::string& why) {
      fail(ExitCode::kData, "{}: tensor '{}': {}", path, name, why);
    };
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
      bad("not an object with dtype, shape and data_offsets");
    if (!t["dtype"].is_string()) bad("dtype is not a string");
    const std::string dtype = t["dtype"].get<std::string>();
    const auto d = parse_safetensors_dtype(dtype);
    if (!d) bad(fmt::format("dtype '{}' is not supported (F32, BF16, F16)", dtype));
    SafeTensor out;
    out.name = name;
    out.dtype = *d;
    if (!t["shape"].is_array()) bad("shape is not a list");
    uint64_t elements = 1;
    for (const auto& dim : t["shape"]) {
      if (!dim.is_number_integer() ||
          (dim.is_number_unsigned() ? dim.get<uint64_t>() >= kMaxDim
                                    : dim.get<int64_t>() < 0 || uint64_t(dim.get<int64_t>()) >= kMaxDim))
        bad(fmt::format("shape dimension {} is not an integer in [0, 2^62)", dim.dump()));
      const uint64_t v = dim.is_number_unsigned() ? dim.get<uint64_t>() : uint64_t(dim.get<int64_t>());
      if (__builtin_mul_overflow(elements, v, &elements) || elements >= kMaxDim)
        bad(fmt::format("shape {} has more than 2^62 elements", t["shape"].dump()));
      out.shape.push_back(static_cast<int64_t>(v));
    }
    const Json& off = t["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad(fmt::format("data_offsets {} is not two byte offsets", off.dump()));
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size)
      bad(fmt::format("data_offsets [{}, {}] reach past the {} bytes of data (a truncated or damaged file)",
                      begin, end, data_size));
    uint64_t want = 0;
    if (__builtin_mul_overflow(elements, uint64_t(dtype_size(*d)), &want) || want != end - begin)
      bad(fmt::format("{} x {} elements of {} take {} bytes, but data_offsets [{}, {}] hold {}", dtype,
                      elements, t["shape"].dump(), want, begin, end, end - begin));
    out.bytes = {f.map_ + f.data_at_ + begin, end - begin};
    ranges.push_back({begin, end, f.tensors_.size()});
    f.tensors_.push_back(std::move(out));
  }
  // The reference reader's rule: the tensors tile the data exactly.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  uint64_t next = 0;
  std::vector<SafeTensor> ordered;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    if (r.begin < next)
      fail(ExitCode::kData, "{}: tensors '{}' and '{}' overlap (bytes {} to {})", path, ordered.back().name,
           f.tensors_[r.tensor].name, r.begin, next);
    if (r.begin > next)
      fail(ExitCode::kData, "{}: bytes {} to {} of the data belong to no tensor", path, next, r.begin);
    next = r.end;
    ordered.push_back(std::move(f.tensors_[r.tensor]));
  }
  if (next != data_size)
    fail(ExitCode::kData, "{}: the last {} bytes of the file belong to no tensor", path, data_size - next);
  f.tensors_ = std::move(ordered);
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      map_(o.map_),
      size_(o.size_),
      data_at_(o.data_at_),
      tensors_(std::move(o.tensors_)),
      metadata_(std::move(o.metadata_)) {
  o.map_ = nullptr;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<std::byte*>(map_), size_);
}

std::span<const std::byte> SafetensorsFile::header() const {
  return {map_, data_at_};
}

void SafetensorsFile::release(const SafeTensor& t) const {
  // Whole pages inside the tensor only: a neighbour's page may still be wanted.
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t lo = static_cast<uint64_t>(t.bytes.data() - map_), hi = lo + t.bytes.size();
  const uint64_t a = (lo + page - 1) / page * page, b = hi / page * page;
  if (b > a) ::madvise(const_cast<std::byte*>(map_) + a, b - a, MADV_DONTNEED);
}

std::string write_safetensors(const std::string& path, const std::vector<SafeTensorOut>& tensors,
                              const Json& metadata) {
  // nlohmann's object is ordered by key; the reference writer orders by dtype alignment then name, and
  // readers take any order. The data follow the list's order.
  Json header = Json::object();
  uint64_t at = 0;
  for (const auto& t : tensors) {
    uint64_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    header[t.name] = {
        {"dtype", safetensors_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {at, at + n}}};
    at += n;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string head(8, '\0');
  for (int i = 0; i < 8; ++i) head[i] = static_cast<char>(uint64_t(text.size()) >> (8 * i) & 0xff);
  head += text;

  Fd fd{::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)};
  if (fd.fd < 0) fail(ExitCode::kIo, "cannot create '{}': {}", path, std::strerror(errno));
  detail::write_all(fd.fd, head.data(), head.size(), path);
  Sha256Stream sha;
  sha.update(head.data(), head.size());
  // One buffer for all tensors, grown and never zero-filled: fresh pages for every tensor would cost a
  // page fault each.
  std::unique_ptr<std::byte[]> buf;
  uint64_t capacity = 0, at_byte = head.size();
  for (const auto& t : tensors) {
    uint64_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    if (n > capacity) buf.reset(new std::byte[n]), capacity = n;
    t.fill({buf.get(), n});
    detail::write_all(fd.fd, buf.get(), n, path);
    // Writeback starts now, while the next tensor is filled: left to the kernel it would wait for the
    // dirty-page threshold (gigabytes), and the final fsync would then write the whole file alone.
    ::sync_file_range(fd.fd, static_cast<off_t>(at_byte), static_cast<off_t>(n), SYNC_FILE_RANGE_WRITE);
    at_byte += n;
    sha.update(buf.get(), n);
  }
  detail::fsync_or_throw(fd.fd, path);
  return sha.hex();
}

}  // namespace forge::ckpt
