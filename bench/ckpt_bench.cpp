// bench_ckpt [DIR] [REPS]: a checkpoint of the trainer benchmark model (configs/bench-cpu.ini: 6 layers,
// d_model 384, vocab 8192: ~14M parameters; parameters + 2 Adam moments, fp32 = ~170 MB) saved and
// loaded in DIR, against peers measured in the same run on the same filesystem:
//   stall of an asynchronous save   vs  the synchronous save of the same checkpoint
//   save write throughput           vs  dd if=/dev/zero bs=16M count=N conv=fsync
//   load (open + read every tensor) vs  a raw pread of the same files
//   per-rank files + index (chosen) vs  one HDF5 file, one dataset per tensor (serial HDF5, fsynced)
// Reads are measured after posix_fadvise(DONTNEED) on the fsynced files (from disk where the kernel
// honours it) and again from the page cache.
#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/saver.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

using namespace forge::ckpt;
namespace fs = std::filesystem;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Model {
  std::vector<Slice> slices;
  std::vector<std::vector<float>> data;
  uint64_t bytes = 0;
};

Model bench_model() {
  const int64_t d = 384, vocab = 8192, seq = 256, layers = 6;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {{"wte", {vocab, d}}, {"wpe", {seq, d}}};
  for (int l = 0; l < layers; ++l) {
    const std::string b = fmt::format("blocks.{}.", l);
    for (const auto& [n, s] :
         std::vector<std::pair<std::string, std::vector<int64_t>>>{{"ln1.weight", {d}},
                                                                   {"ln1.bias", {d}},
                                                                   {"attn.qkv.weight", {3 * d, d}},
                                                                   {"attn.qkv.bias", {3 * d}},
                                                                   {"attn.proj.weight", {d, d}},
                                                                   {"attn.proj.bias", {d}},
                                                                   {"ln2.weight", {d}},
                                                                   {"ln2.bias", {d}},
                                                                   {"mlp.fc.weight", {4 * d, d}},
                                                                   {"mlp.fc.bias", {4 * d}},
                                                                   {"mlp.proj.weight", {d, 4 * d}},
                                                                   {"mlp.proj.bias", {d}}})
      shapes.push_back({b + n, s});
  }
  shapes.push_back({"lnf.weight", {d}});
  shapes.push_back({"lnf.bias", {d}});
  Model m;
  for (const char* kind : {"param/", "adam_m/", "adam_v/"})
    for (const auto& [n, s] : shapes) {
      m.slices.push_back(Slice::whole(kind + n, s).normalized());
      m.data.emplace_back(static_cast<size_t>(m.slices.back().elements()));
      auto& v = m.data.back();
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 977) * 0.001f;
      m.bytes += m.slices.back().bytes();
    }
  return m;
}

void drop_cache(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

double raw_read(const std::string& dir, std::vector<char>& buf) {
  const double t0 = now();
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".bin") continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    const size_t size = fs::file_size(e.path());
    if (buf.size() < size) buf.resize(size);
    for (size_t off = 0; off < size;) {
      const ssize_t n = ::pread(fd, buf.data() + off, std::min<size_t>(size - off, 16u << 20), off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    ::close(fd);
  }
  return now() - t0;
}

double load(const std::string& dir, const Model& m, std::vector<std::vector<float>>& out) {
  const double t0 = now();
  const Checkpoint c = Checkpoint::open(dir);
  std::vector<TensorRequest> req;
  for (size_t i = 0; i < m.slices.size(); ++i) req.push_back(TensorRequest{m.slices[i], out[i].data()});
  c.read(req);
  return now() - t0;
}

double hdf5_write(const std::string& path, const Model& m) {
  const double t0 = now();
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  for (size_t i = 0; i < m.slices.size(); ++i) {
    std::vector<hsize_t> dims(m.slices[i].shape.begin(), m.slices[i].shape.end());
    const hid_t sp = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t ds =
        H5Dcreate2(f, ("/" + m.slices[i].name).c_str(), H5T_IEEE_F32LE, sp, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, m.data[i].data());
    H5Dclose(ds);
    H5Sclose(sp);
  }
  H5Pclose(lcpl);
  H5Fclose(f);
  const int fd = ::open(path.c_str(), O_RDONLY);
  ::fsync(fd);
  ::close(fd);
  return now() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "bench-ckpt.tmp";
  const int reps = argc > 2 ? std::stoi(argv[2]) : 3;
  fs::remove_all(dir);
  fs::create_directories(dir);
  const Model m = bench_model();
  const double mb = static_cast<double>(m.bytes) / 1e6;
  int64_t params = 0;
  for (size_t i = 0; i < m.slices.size() / 3; ++i) params += m.slices[i].elements();
  fmt::print("checkpoint: {} parameters, {} tensors, {:.1f} MB (params + 2 Adam moments, fp32), dir {}\n",
             params, m.slices.size(), mb, fs::absolute(dir).string());

  std::vector<TensorData> tensors;
  for (size_t i = 0; i < m.slices.size(); ++i) tensors.push_back(TensorData{m.slices[i], m.data[i].data()});
  SingleProcessCoordinator coord;
  const std::string run = dir + "/run";
  std::vector<double> dd_s, sync_s, stall_s, async_total_s, copy_s, load_cold, raw_cold, load_hot, raw_hot,
      h5_s;
  std::vector<std::vector<float>> out(m.slices.size());
  for (size_t i = 0; i < m.slices.size(); ++i) out[i].resize(m.data[i].size());
  std::vector<char> raw;
  int64_t step = 0;
  Saver saver(coord, SaverOptions{run, AsyncPolicy::kWait, 2});
  CheckpointMeta meta;
  meta.step = ++step;
  if (saver.save(Tier::kRecovery, meta, tensors).outcome != Outcome::kCommitted)
    return 1;  // warm-up: buffers
  for (int r = 0; r < reps; ++r) {
    const int count = static_cast<int>((m.bytes + (16u << 20) - 1) / (16u << 20));
    double t0 = now();
    const std::string dd =
        fmt::format("dd if=/dev/zero of={}/dd.bin bs=16M count={} conv=fsync status=none", dir, count);
    if (std::system(dd.c_str()) != 0) return 1;
    dd_s.push_back((now() - t0) * static_cast<double>(m.bytes) / (static_cast<double>(count) * (16u << 20)));
    fs::remove(dir + "/dd.bin");

    meta.step = ++step;
    t0 = now();
    const SaveEvent s = saver.save(Tier::kRecovery, meta, tensors);
    sync_s.push_back(now() - t0);
    if (s.outcome != Outcome::kCommitted) return 1;

    meta.step = ++step;
    t0 = now();
    const SaveEvent a = saver.save_async(Tier::kRecovery, meta, tensors);
    stall_s.push_back(a.stall_s);
    copy_s.push_back(a.copy_s);
    saver.wait();
    async_total_s.push_back(now() - t0);

    const std::string ck = checkpoint_dir(run, Tier::kRecovery, step);
    drop_cache(ck);
    load_cold.push_back(load(ck, m, out));
    drop_cache(ck);
    raw_cold.push_back(raw_read(ck, raw));
    load_hot.push_back(load(ck, m, out));
    raw_hot.push_back(raw_read(ck, raw));

    h5_s.push_back(hdf5_write(dir + "/one.h5", m));
    fs::remove(dir + "/one.h5");
  }
  for (size_t i = 0; i < m.slices.size(); ++i)
    if (out[i] != m.data[i]) {
      fmt::print("load mismatch in {}\n", m.slices[i].name);
      return 1;
    }
  const double dd_t = median(dd_s), sync_t = median(sync_s), stall = median(stall_s);
  fmt::print("{:<46} {:>10} {:>10}\n", "measure (median of " + std::to_string(reps) + ")", "seconds", "MB/s");
  auto row = [&](const std::string& what, double s) {
    fmt::print("{:<46} {:>10.3f} {:>10.0f}\n", what, s, mb / s);
  };
  row("dd bs=16M conv=fsync (same bytes)", dd_t);
  row("synchronous save (copy + write + fsync + commit)", sync_t);
  row("async save: stall (agreement + snapshot copy)", stall);
  row("async save: of which snapshot copy", median(copy_s));
  row("async save: until committed", median(async_total_s));
  row("one HDF5 file, dataset per tensor, fsync", median(h5_s));
  row("load, after fadvise(DONTNEED)", median(load_cold));
  row("raw pread of the same files, after DONTNEED", median(raw_cold));
  row("load, page cache", median(load_hot));
  row("raw pread, page cache", median(raw_hot));
  fmt::print("ratio stall / synchronous save:        {:.3f}\n", stall / sync_t);
  fmt::print("ratio save throughput / dd conv=fsync: {:.2f}\n", dd_t / sync_t);
  fmt::print("ratio per-rank files / one HDF5 file:  {:.2f} (write time, HDF5 / ours)\n",
             median(h5_s) / sync_t);
  fmt::print("ratio load / raw read (cold, hot):     {:.2f}, {:.2f}\n", median(load_cold) / median(raw_cold),
             median(load_hot) / median(raw_hot));
  fs::remove_all(dir);
  return 0;
}
