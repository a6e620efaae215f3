#include "forge/ckpt/export.h"

#include "forge/common/error.h"
#include "forge/common/progress_line.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace forge::ckpt {

namespace {

// One owned HDF5 handle; the close function matches the kind of object.
class H5 {
 public:
  H5(hid_t id, herr_t (*close)(hid_t), const std::string& what) : id_(id), close_(close) {
    if (id_ < 0) fail(ExitCode::kIo, "HDF5 failed to {}", what);
  }
  ~H5() { close_(id_); }
  H5(const H5&) = delete;
  H5& operator=(const H5&) = delete;
  hid_t get() const { return id_; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

void check(herr_t rc, const std::string& what) {
  if (rc < 0) fail(ExitCode::kIo, "HDF5 failed to {}", what);
}

// Creates scalar attribute `name` of `type` on `obj` and writes `value` (memory laid out as `type`).
void scalar_attr(hid_t obj, const char* name, hid_t type, const void* value) {
  H5 space(H5Screate(H5S_SCALAR), H5Sclose, "create a scalar space");
  H5 attr(H5Acreate2(obj, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
          std::string("create attribute ") + name);
  check(H5Awrite(attr.get(), type, value), std::string("write attribute ") + name);
}

void string_attr(hid_t obj, const char* name, const std::string& value) {
  H5 type(H5Tcopy(H5T_C_S1), H5Tclose, "create a string type");
  check(H5Tset_size(type.get(), H5T_VARIABLE), "size a string type");
  check(H5Tset_cset(type.get(), H5T_CSET_UTF8), "set UTF-8");
  const char* p = value.c_str();
  scalar_attr(obj, name, type.get(), &p);
}

template <typename T>
void number_attr(hid_t obj, const char* name, hid_t type, T value) {
  scalar_attr(obj, name, type, &value);
}

// File type and memory type of a stored dtype; 16-bit floats travel as uint16 (h5py has no bf16).
struct H5Types {
  hid_t file;
  hid_t memory;
};
H5Types h5_types(DType d) {
  switch (d) {
    case DType::kF32:
      return {H5T_IEEE_F32LE, H5T_NATIVE_FLOAT};
    case DType::kBF16:
    case DType::kF16:
      return {H5T_STD_U16LE, H5T_NATIVE_UINT16};
    case DType::kU8:
      return {H5T_STD_U8LE, H5T_NATIVE_UINT8};
    case DType::kI32:
      return {H5T_STD_I32LE, H5T_NATIVE_INT32};
    case DType::kI64:
      return {H5T_STD_I64LE, H5T_NATIVE_INT64};
  }
  return {H5T_STD_U8LE, H5T_NATIVE_UINT8};
}

void write_file(const Checkpoint& ckpt, const std::string& path, bool with_optimizer) {
  H5 file(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT), H5Fclose, "create " + path);
  const Manifest& m = ckpt.manifest();
  string_attr(file.get(), "format", "forge-ckpt-export/1");
  number_attr<int64_t>(file.get(), "step", H5T_NATIVE_INT64, m.meta.step);
  number_attr<int64_t>(file.get(), "tokens", H5T_NATIVE_INT64, m.meta.tokens);
  number_attr<double>(file.get(), "loss", H5T_NATIVE_DOUBLE, m.meta.loss);
  string_attr(file.get(), "spec_hash", m.meta.spec_hash);
  string_attr(file.get(), "dataset_version", m.meta.dataset_version);
  string_attr(file.get(), "model_config", m.meta.model_config.dump());
  string_attr(file.get(), "tier", m.tier);
  string_attr(file.get(), "manifest", m.to_json().dump());

  H5 lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose, "create a link property list");
  check(H5Pset_create_intermediate_group(lcpl.get(), 1), "allow intermediate groups");
  check(H5Pset_char_encoding(lcpl.get(), H5T_CSET_UTF8), "set UTF-8 names");
  const auto wanted = [&](const std::string& name) { return with_optimizer || name.rfind("param/", 0) == 0; };
  uint64_t tensors = 0, bytes = 0;
  for (const auto& [name, t] : ckpt.tensors())
    if (wanted(name)) {
      ++tensors;
      bytes += Slice::whole(name, t.shape, t.dtype).bytes();
    }
  ProgressLine progress("export " + path.substr(0, path.rfind(".tmp.")), "tensors", tensors, bytes);
  std::vector<char> buf;
  for (const auto& [name, t] : ckpt.tensors()) {
    if (!wanted(name)) continue;
    const Slice whole = Slice::whole(name, t.shape, t.dtype);
    buf.resize(whole.bytes());
    ckpt.read({TensorRequest{whole, buf.data()}});
    std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
    H5 space(dims.empty() ? H5Screate(H5S_SCALAR)
                          : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
             H5Sclose, "create the space of " + name);
    const H5Types types = h5_types(t.dtype);
    H5 ds(H5Dcreate2(file.get(), ("/" + name).c_str(), types.file, space.get(), lcpl.get(), H5P_DEFAULT,
                     H5P_DEFAULT),
          H5Dclose, "create dataset /" + name);
    if (!buf.empty())
      check(H5Dwrite(ds.get(), types.memory, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()), "write /" + name);
    string_attr(ds.get(), "dtype", std::string(dtype_name(t.dtype)));
    progress.add(1, buf.size());
  }
  check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "flush " + path);
}

}  // namespace

void export_hdf5(const Checkpoint& ckpt, const std::string& out, bool with_optimizer) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors become one forge::Error line, not a stack dump
  const std::string tmp = out + ".tmp." + std::to_string(::getpid());
  ::unlink(tmp.c_str());
  try {
    write_file(ckpt, tmp, with_optimizer);
    const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
    const int rc = fd < 0 ? -1 : ::fsync(fd);
    const int err = errno;
    if (fd >= 0) ::close(fd);
    if (rc != 0) fail(ExitCode::kIo, "cannot fsync '{}': {}", tmp, std::strerror(err));
    if (::rename(tmp.c_str(), out.c_str()) != 0)
      fail(ExitCode::kIo, "cannot write '{}' (rename failed: {})", out, std::strerror(errno));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  const auto parent = std::filesystem::path(out).parent_path();
  fsync_dir(parent.empty() ? "." : parent.string());
}

}  // namespace forge::ckpt
