#include "forge/dataio/shard.h"

#include "forge/common/error.h"
#include "forge/common/json.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <iterator>

namespace forge::data {
namespace {

// Closes an HDF5 handle with the right function when it leaves scope.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  operator hid_t() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// HDF5 prints its error stack to stderr by default; our errors name the shard instead. The setting is
// per thread in a thread-safe build, so it is restored on exit and never touches other threads.
class QuietErrors {
 public:
  QuietErrors() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

void check(herr_t status, const std::string& path, const char* what) {
  if (status < 0) fail(ExitCode::kIo, "{}: HDF5 failed to {}", path, what);
}

void write_dataset(hid_t file, const char* name, hid_t mem_type, hid_t file_type, const void* data,
                   std::initializer_list<hsize_t> dims, const std::string& path) {
  Handle space(H5Screate_simple(static_cast<int>(dims.size()), std::data(dims), nullptr), H5Sclose);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_obj_track_times(dcpl, false);  // no timestamps: same content, same bytes, same checksum
  H5Pset_layout(dcpl, H5D_CONTIGUOUS);
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
  Handle ds(H5Dcreate2(file, name, file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) fail(ExitCode::kIo, "{}: HDF5 failed to create dataset {}", path, name);
  if (std::data(dims)[0] > 0)
    check(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), path, "write a dataset");
}

void write_dataset(hid_t file, const char* name, hid_t mem_type, hid_t file_type, const void* data,
                   uint64_t count, const std::string& path) {
  write_dataset(file, name, mem_type, file_type, data, {hsize_t{count}}, path);
}

void write_string_attr(hid_t obj, const char* name, const std::string& value, const std::string& path) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, std::max<size_t>(1, value.size()));
  H5Tset_strpad(type, H5T_STR_NULLPAD);
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  check(attr.ok() ? H5Awrite(attr, type, value.data()) : -1, path, "write an attribute");
}

void write_int_attr(hid_t obj, const char* name, int64_t value, const std::string& path) {
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  check(attr.ok() ? H5Awrite(attr, H5T_NATIVE_INT64, &value) : -1, path, "write an attribute");
}

std::string read_string_attr(hid_t obj, const char* name, const std::string& path) {
  Handle attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!attr.ok()) fail(ExitCode::kData, "shard {}: attribute '{}' missing", path, name);
  Handle type(H5Aget_type(attr), H5Tclose);
  if (H5Tget_class(type) != H5T_STRING)
    fail(ExitCode::kData, "shard {}: attribute '{}' is not a string", path, name);
  std::string value(H5Tget_size(type), '\0');
  Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mem, value.size());
  H5Tset_strpad(mem, H5T_STR_NULLPAD);
  if (H5Aread(attr, mem, value.data()) < 0)
    fail(ExitCode::kData, "shard {}: cannot read attribute '{}'", path, name);
  value.resize(strnlen(value.data(), value.size()));
  return value;
}

int64_t read_int_attr(hid_t obj, const char* name, const std::string& path) {
  Handle attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  int64_t value = 0;
  if (!attr.ok() || H5Aread(attr, H5T_NATIVE_INT64, &value) < 0)
    fail(ExitCode::kData, "shard {}: attribute '{}' missing or unreadable", path, name);
  return value;
}

// Opens a 1-D dataset and returns its length; checks its integer width.
uint64_t dataset_length(hid_t file, const char* name, size_t want_bytes, const std::string& path,
                        hid_t* out) {
  *out = H5Dopen2(file, name, H5P_DEFAULT);
  if (*out < 0) fail(ExitCode::kData, "shard {}: dataset '{}' missing or unreadable", path, name);
  Handle space(H5Dget_space(*out), H5Sclose);
  Handle type(H5Dget_type(*out), H5Tclose);
  hsize_t dims[1] = {0};
  if (H5Sget_simple_extent_ndims(space) != 1 || H5Sget_simple_extent_dims(space, dims, nullptr) < 0)
    fail(ExitCode::kData, "shard {}: dataset '{}' is not one-dimensional", path, name);
  if (H5Tget_class(type) != H5T_INTEGER || H5Tget_sign(type) != H5T_SGN_NONE ||
      (want_bytes && H5Tget_size(type) != want_bytes))
    fail(ExitCode::kData, "shard {}: dataset '{}' has the wrong element type", path, name);
  return dims[0];
}

// An image-text shard's /images (pictures of image_size^2 * 3 bytes, contiguous inside the file) and
// /image_positions (one per picture).
void read_image_layout(hid_t file, const std::string& path, ShardLayout& layout) {
  layout.attrs.image_size = static_cast<uint32_t>(read_int_attr(file, "image_size", path));
  layout.attrs.image_tokens = static_cast<uint32_t>(read_int_attr(file, "image_tokens", path));
  const uint32_t size = layout.attrs.image_size;
  if (size == 0 || size > 4096 || layout.attrs.image_tokens == 0)
    fail(ExitCode::kData, "shard {}: image_size {} and image_tokens {} do not describe pictures", path, size,
         layout.attrs.image_tokens);
  Handle images(H5Dopen2(file, "images", H5P_DEFAULT), H5Dclose);
  if (!images.ok()) fail(ExitCode::kData, "shard {}: dataset 'images' unreadable", path);
  Handle space(H5Dget_space(images), H5Sclose);
  Handle type(H5Dget_type(images), H5Tclose);
  Handle dcpl(H5Dget_create_plist(images), H5Pclose);
  hsize_t dims[4] = {};
  if (H5Sget_simple_extent_ndims(space) != 4 || H5Sget_simple_extent_dims(space, dims, nullptr) < 0 ||
      dims[1] != size || dims[2] != size || dims[3] != 3 || H5Tget_class(type) != H5T_INTEGER ||
      H5Tget_size(type) != 1 || H5Pget_layout(dcpl) != H5D_CONTIGUOUS)
    fail(ExitCode::kData, "shard {}: /images is not contiguous uint8 [pictures, {}, {}, 3]", path, size,
         size);
  hid_t pos_raw = -1;
  const uint64_t positions = dataset_length(file, "image_positions", 8, path, &pos_raw);
  Handle close_positions(pos_raw, H5Dclose);
  if (positions != dims[0])
    fail(ExitCode::kData, "shard {}: {} image_positions for {} pictures", path, positions, dims[0]);
  const uint64_t bytes = dims[0] * size * size * 3;
  const haddr_t at = H5Dget_offset(images);
  if (bytes > 0 && (at == HADDR_UNDEF || uint64_t(at) + bytes > layout.file_bytes))
    fail(ExitCode::kData, "shard {}: truncated: /images lies outside the file", path);
  layout.has_images = true;
  layout.images = dims[0];
  layout.images_offset = bytes > 0 ? uint64_t(at) : 0;
}

}  // namespace

int token_bytes_for_vocab(uint32_t vocab) {
  return vocab <= 65535 ? 2 : 4;
}

void write_shard(const std::string& path, const ShardData& data, const ShardAttrs& attrs, int token_bytes) {
  const QuietErrors quiet;
  const std::string tmp = path + ".tmp";
  {
    Handle fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
    H5Pset_obj_track_times(fcpl, false);
    Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl, H5P_DEFAULT), H5Fclose);
    if (!file.ok())
      fail(ExitCode::kIo, "{}: cannot create shard file (check the directory and free space)", tmp);
    const uint64_t n = data.tokens.size();
    if (token_bytes == 2) {
      std::vector<uint16_t> narrow(n);
      for (uint64_t i = 0; i < n; ++i) narrow[i] = static_cast<uint16_t>(data.tokens[i]);
      write_dataset(file, "tokens", H5T_NATIVE_UINT16, H5T_STD_U16LE, narrow.data(), n, tmp);
    } else {
      write_dataset(file, "tokens", H5T_NATIVE_UINT32, H5T_STD_U32LE, data.tokens.data(), n, tmp);
    }
    write_dataset(file, "doc_offsets", H5T_NATIVE_UINT64, H5T_STD_U64LE, data.doc_offsets.data(),
                  data.doc_offsets.size(), tmp);
    write_dataset(file, "doc_domains", H5T_NATIVE_UINT16, H5T_STD_U16LE, data.doc_domains.data(),
                  data.doc_domains.size(), tmp);
    write_dataset(file, "doc_licenses", H5T_NATIVE_UINT16, H5T_STD_U16LE, data.doc_licenses.data(),
                  data.doc_licenses.size(), tmp);
    if (!data.doc_languages.empty()) {
      if (data.doc_languages.size() != data.doc_domains.size())
        fail(ExitCode::kIo, "{}: {} document languages for {} documents", tmp, data.doc_languages.size(),
             data.doc_domains.size());
      write_dataset(file, "doc_languages", H5T_NATIVE_UINT16, H5T_STD_U16LE, data.doc_languages.data(),
                    data.doc_languages.size(), tmp);
    }
    if (!data.loss_mask.empty()) {
      if (data.loss_mask.size() != n)
        fail(ExitCode::kIo, "{}: {} loss-mask values for {} tokens", tmp, data.loss_mask.size(), n);
      write_dataset(file, "loss_mask", H5T_NATIVE_UINT8, H5T_STD_U8LE, data.loss_mask.data(), n, tmp);
    }
    if (attrs.image_size > 0) {
      const uint64_t pixels = uint64_t{attrs.image_size} * attrs.image_size * 3;
      if (data.images.size() != data.image_positions.size() * pixels)
        fail(ExitCode::kIo, "{}: {} image bytes for {} pictures of {}x{}", tmp, data.images.size(),
             data.image_positions.size(), attrs.image_size, attrs.image_size);
      write_dataset(file, "images", H5T_NATIVE_UINT8, H5T_STD_U8LE, data.images.data(),
                    {data.image_positions.size(), attrs.image_size, attrs.image_size, 3}, tmp);
      write_dataset(file, "image_positions", H5T_NATIVE_UINT64, H5T_STD_U64LE, data.image_positions.data(),
                    data.image_positions.size(), tmp);
      write_int_attr(file, "image_size", attrs.image_size, tmp);
      write_int_attr(file, "image_tokens", attrs.image_tokens, tmp);
    }
    write_int_attr(file, "schema_version", attrs.schema_version, tmp);
    write_string_attr(file, "split", attrs.split, tmp);
    write_string_attr(file, "domain", attrs.domain, tmp);
    write_string_attr(file, "tokenizer_sha256", attrs.tokenizer_sha256, tmp);
    write_int_attr(file, "vocab_size", attrs.vocab_size, tmp);
    check(H5Fflush(file, H5F_SCOPE_GLOBAL), tmp, "flush the file");
  }
  const int fd = ::open(tmp.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    fail(ExitCode::kIo, "{}: fsync failed: {}", tmp, std::strerror(err));
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    fail(ExitCode::kIo, "{}: rename to {} failed: {}", tmp, path, std::strerror(errno));
  fsync_dir(std::filesystem::path(path).parent_path().string());
}

ShardLayout read_shard_layout(const std::string& path) {
  const QuietErrors quiet;
  ShardLayout layout;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    fail(ExitCode::kData, "shard {}: missing ({})", path, std::strerror(errno));
  layout.file_bytes = static_cast<uint64_t>(st.st_size);
  if (H5Fis_hdf5(path.c_str()) <= 0)
    fail(ExitCode::kData, "shard {}: not an HDF5 file (truncated or corrupted?)", path);
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) fail(ExitCode::kData, "shard {}: HDF5 cannot open it (truncated or corrupted?)", path);
  layout.attrs.schema_version = static_cast<int>(read_int_attr(file, "schema_version", path));
  if (layout.attrs.schema_version != kShardSchemaVersion)
    fail(ExitCode::kData, "shard {}: schema_version {} (this build reads {})", path,
         layout.attrs.schema_version, kShardSchemaVersion);
  layout.attrs.split = read_string_attr(file, "split", path);
  layout.attrs.domain = read_string_attr(file, "domain", path);
  layout.attrs.tokenizer_sha256 = read_string_attr(file, "tokenizer_sha256", path);
  layout.attrs.vocab_size = static_cast<uint32_t>(read_int_attr(file, "vocab_size", path));
  hid_t raw = -1;
  layout.tokens = dataset_length(file, "tokens", 0, path, &raw);
  Handle tokens(raw, H5Dclose);
  {
    Handle type(H5Dget_type(tokens), H5Tclose);
    layout.token_bytes = static_cast<int>(H5Tget_size(type));
    if (layout.token_bytes != 2 && layout.token_bytes != 4)
      fail(ExitCode::kData, "shard {}: tokens are {}-byte integers (expected 2 or 4)", path,
           layout.token_bytes);
    Handle dcpl(H5Dget_create_plist(tokens), H5Pclose);
    if (H5Pget_layout(dcpl) != H5D_CONTIGUOUS)
      fail(ExitCode::kData, "shard {}: /tokens is not stored contiguously", path);
  }
  const haddr_t offset = H5Dget_offset(tokens);
  if (layout.tokens > 0 && offset == HADDR_UNDEF)
    fail(ExitCode::kData, "shard {}: /tokens has no storage", path);
  layout.token_offset = layout.tokens > 0 ? static_cast<uint64_t>(offset) : 0;
  if (layout.token_offset + layout.tokens * layout.token_bytes > layout.file_bytes)
    fail(ExitCode::kData, "shard {}: truncated: tokens end at byte {} but the file has {} bytes", path,
         layout.token_offset + layout.tokens * layout.token_bytes, layout.file_bytes);
  hid_t off_raw = -1, dom_raw = -1, lic_raw = -1;
  const uint64_t n_offsets = dataset_length(file, "doc_offsets", 8, path, &off_raw);
  Handle offsets(off_raw, H5Dclose);
  const uint64_t n_domains = dataset_length(file, "doc_domains", 2, path, &dom_raw);
  Handle domains(dom_raw, H5Dclose);
  const uint64_t n_licenses = dataset_length(file, "doc_licenses", 2, path, &lic_raw);
  Handle licenses(lic_raw, H5Dclose);
  if (n_offsets != n_domains + 1 || n_licenses != n_domains)
    fail(ExitCode::kData, "shard {}: {} doc_offsets, {} doc_domains, {} doc_licenses do not match", path,
         n_offsets, n_domains, n_licenses);
  layout.documents = n_domains;
  if (H5Lexists(file, "doc_languages", H5P_DEFAULT) > 0) {
    hid_t lang_raw = -1;
    const uint64_t n_languages = dataset_length(file, "doc_languages", 2, path, &lang_raw);
    Handle languages(lang_raw, H5Dclose);
    if (n_languages != n_domains)
      fail(ExitCode::kData, "shard {}: {} doc_languages for {} documents", path, n_languages, n_domains);
    layout.has_languages = true;
  }
  if (H5Lexists(file, "loss_mask", H5P_DEFAULT) > 0) {
    hid_t mask_raw = -1;
    const uint64_t n_mask = dataset_length(file, "loss_mask", 1, path, &mask_raw);
    Handle mask(mask_raw, H5Dclose);
    Handle dcpl(H5Dget_create_plist(mask), H5Pclose);
    if (n_mask != layout.tokens || H5Pget_layout(dcpl) != H5D_CONTIGUOUS)
      fail(ExitCode::kData, "shard {}: /loss_mask must hold one contiguous byte per token ({} for {} tokens)",
           path, n_mask, layout.tokens);
    const haddr_t mask_at = H5Dget_offset(mask);
    if (n_mask > 0 && (mask_at == HADDR_UNDEF || uint64_t(mask_at) + n_mask > layout.file_bytes))
      fail(ExitCode::kData, "shard {}: truncated: /loss_mask lies outside the file", path);
    layout.has_loss_mask = true;
    layout.loss_mask_offset = n_mask > 0 ? uint64_t(mask_at) : 0;
  }
  if (H5Lexists(file, "images", H5P_DEFAULT) > 0) read_image_layout(file, path, layout);
  return layout;
}

std::vector<uint64_t> read_doc_offsets(const std::string& path, const ShardLayout& layout) {
  const QuietErrors quiet;
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  hid_t raw = -1;
  if (!file.ok() || dataset_length(file, "doc_offsets", 8, path, &raw) != layout.documents + 1) {
    if (raw >= 0) H5Dclose(raw);
    fail(ExitCode::kData, "shard {}: /doc_offsets does not have documents + 1 = {} values", path,
         layout.documents + 1);
  }
  Handle ds(raw, H5Dclose);
  std::vector<uint64_t> offsets(layout.documents + 1);
  if (H5Dread(ds, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets.data()) < 0)
    fail(ExitCode::kData, "shard {}: cannot read dataset 'doc_offsets' (corrupted?)", path);
  if (offsets.front() != 0 || offsets.back() != layout.tokens)
    fail(ExitCode::kData, "shard {}: doc_offsets do not span the token dataset", path);
  for (size_t i = 0; i + 1 < offsets.size(); ++i)
    if (offsets[i] > offsets[i + 1])
      fail(ExitCode::kData, "shard {}: doc_offsets decrease at document {}", path, i);
  return offsets;
}

std::vector<uint64_t> read_image_positions(const std::string& path, const ShardLayout& layout) {
  const QuietErrors quiet;
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  hid_t raw = -1;
  if (!file.ok() || dataset_length(file, "image_positions", 8, path, &raw) != layout.images) {
    if (raw >= 0) H5Dclose(raw);
    fail(ExitCode::kData, "shard {}: /image_positions does not have one value per picture ({})", path,
         layout.images);
  }
  Handle ds(raw, H5Dclose);
  std::vector<uint64_t> positions(layout.images);
  if (layout.images > 0 &&
      H5Dread(ds, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, positions.data()) < 0)
    fail(ExitCode::kData, "shard {}: cannot read dataset 'image_positions' (corrupted?)", path);
  const uint64_t run = layout.attrs.image_tokens;
  for (size_t k = 0; k < positions.size(); ++k)
    if (positions[k] + run > layout.tokens || (k > 0 && positions[k] < positions[k - 1] + run))
      fail(ExitCode::kData, "shard {}: picture {}'s run at token {} overlaps another or leaves /tokens", path,
           k, positions[k]);
  return positions;
}

ShardData read_shard(const std::string& path, ShardLayout* layout_out) {
  const ShardLayout layout = read_shard_layout(path);
  const QuietErrors quiet;
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  ShardData data;
  data.tokens.resize(layout.tokens);
  data.doc_offsets.resize(layout.documents + 1);
  data.doc_domains.resize(layout.documents);
  data.doc_licenses.resize(layout.documents);
  const auto read = [&](const char* name, hid_t mem_type, void* dst) {
    Handle ds(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
    if (!ds.ok() || H5Dread(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0)
      fail(ExitCode::kData, "shard {}: cannot read dataset '{}' (corrupted?)", path, name);
  };
  if (layout.tokens > 0) read("tokens", H5T_NATIVE_UINT32, data.tokens.data());
  if (layout.has_loss_mask) {
    data.loss_mask.resize(layout.tokens);
    if (layout.tokens > 0) read("loss_mask", H5T_NATIVE_UINT8, data.loss_mask.data());
  }
  read("doc_offsets", H5T_NATIVE_UINT64, data.doc_offsets.data());
  if (layout.documents > 0) {
    read("doc_domains", H5T_NATIVE_UINT16, data.doc_domains.data());
    read("doc_licenses", H5T_NATIVE_UINT16, data.doc_licenses.data());
    if (layout.has_languages) {
      data.doc_languages.resize(layout.documents);
      read("doc_languages", H5T_NATIVE_UINT16, data.doc_languages.data());
    }
  }
  if (layout.has_images && layout.images > 0) {
    const uint64_t size = layout.attrs.image_size;
    data.images.resize(layout.images * size * size * 3);
    data.image_positions.resize(layout.images);
    read("images", H5T_NATIVE_UINT8, data.images.data());
    read("image_positions", H5T_NATIVE_UINT64, data.image_positions.data());
  }
  if (layout_out) *layout_out = layout;
  return data;
}

}  // namespace forge::data
