// Reads the PyTorch reference fixture (HDF5) in the trainer tests.
#pragma once

#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace forge::test {

// max |a - b| / max(max |b|, tiny): a difference relative to the reference b's largest magnitude.
inline double rel_diff(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) throw std::invalid_argument("rel_diff: the tensors differ in size");
  double diff = 0, scale = 1e-12;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / scale;
}

class H5Fixture {
 public:
  explicit H5Fixture(const std::string& path) : file_(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)) {
    if (file_ < 0) throw std::runtime_error("cannot open fixture " + path);
  }
  ~H5Fixture() { H5Fclose(file_); }
  H5Fixture(const H5Fixture&) = delete;
  H5Fixture& operator=(const H5Fixture&) = delete;

  std::vector<float> floats(const std::string& name) const { return read<float>(name, H5T_NATIVE_FLOAT); }
  std::vector<double> doubles(const std::string& name) const { return read<double>(name, H5T_NATIVE_DOUBLE); }
  std::vector<int32_t> ints(const std::string& name) const { return read<int32_t>(name, H5T_NATIVE_INT32); }

  // An attribute of the file, or of a group: "group/name".
  double attr(const std::string& name) const {
    double v = 0;
    const size_t slash = name.rfind('/');
    const std::string object = slash == std::string::npos ? "/" : name.substr(0, slash);
    const std::string attribute = slash == std::string::npos ? name : name.substr(slash + 1);
    const hid_t a = H5Aopen_by_name(file_, object.c_str(), attribute.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0 || H5Aread(a, H5T_NATIVE_DOUBLE, &v) < 0) throw std::runtime_error("fixture attribute " + name);
    H5Aclose(a);
    return v;
  }

  // A fixed-length string attribute ("group/name").
  std::string text(const std::string& name) const {
    const size_t slash = name.rfind('/');
    const std::string object = slash == std::string::npos ? "/" : name.substr(0, slash);
    const std::string attribute = slash == std::string::npos ? name : name.substr(slash + 1);
    const hid_t a = H5Aopen_by_name(file_, object.c_str(), attribute.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0) throw std::runtime_error("fixture attribute " + name);
    const hid_t type = H5Aget_type(a);
    std::string v(H5Tget_size(type), '\0');
    const herr_t read = H5Aread(a, type, v.data());
    H5Tclose(type);
    H5Aclose(a);
    if (read < 0) throw std::runtime_error("fixture attribute " + name);
    return v.substr(0, v.find('\0'));
  }

 private:
  template <typename T>
  std::vector<T> read(const std::string& name, hid_t type) const {
    const hid_t d = H5Dopen2(file_, name.c_str(), H5P_DEFAULT);
    if (d < 0) throw std::runtime_error("fixture has no dataset " + name);
    const hid_t space = H5Dget_space(d);
    std::vector<T> out(size_t(H5Sget_simple_extent_npoints(space)));
    const herr_t rc = H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data());
    H5Sclose(space);
    H5Dclose(d);
    if (rc < 0) throw std::runtime_error("cannot read fixture dataset " + name);
    return out;
  }

  hid_t file_;
};

}  // namespace forge::test
