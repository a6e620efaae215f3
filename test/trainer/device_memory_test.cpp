// The runtime on a backend whose memory the host cannot read (FarBackend, a GPU's stand-in: any direct
// host access to its buffers crashes): training, the staged communicators and checkpoints through host
// staging must give the CPU backend's results bit for bit, and a checkpoint must move between the two.
#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/coordinator.h"
#include "forge/ckpt/saver.h"
#include "forge/comm/groups.h"
#include "forge/trainer/checkpoint_io.h"
#include "forge/trainer/parallel.h"
#include "forge/trainer/staged_comm.h"
#include "support/far_backend.h"
#include "support/temp_dir.h"
#include "support/training.h"

#include <catch2/catch.hpp>

#include <numeric>
#include <vector>

using namespace forge::trainer;
using namespace forge::comm;
using forge::test::FarBackend;

namespace {

TrainSpec small_spec(DType dtype) {
  TrainSpec s;
  s.steps = 10;
  s.seed = 99;
  s.threads = 1;
  s.batch = 2;
  s.microbatches = 2;
  s.model = gpt2_spec(2, 32, 4, 64, 16);
  s.optim.lr = 1e-2;
  s.optim.warmup_steps = 1;
  s.dtype = dtype;
  return s;
}

std::vector<forge::MicroBatch> batches(const TrainSpec& spec, int step) {
  std::vector<forge::MicroBatch> out;
  const int T = spec.model.seq_len;
  for (int m = 0; m < spec.microbatches; ++m) {
    std::vector<int32_t> windows(size_t(spec.batch) * size_t(T + 1));
    for (size_t i = 0; i < windows.size(); ++i)
      windows[i] = int32_t((i * 7 + size_t(step) * 13 + size_t(m)) % 64);
    out.push_back(forge::test::window_batch(windows, spec.batch, T, uint64_t(m * spec.batch)));
  }
  return out;
}

// The trainer of `spec` at layout 1,1,1 on `backend`, its communicator staged as a GPU run's MPI fallback.
struct Run {
  Run(const TrainSpec& spec, Backend& backend)
      : groups(make_groups(staged_comm(self_comm(), backend, CommMemory::kHost), spec.layout)),
        trainer(spec, groups, backend) {}
  ProcessGroups groups;
  ParallelTrainer trainer;
  std::vector<float> weights() {
    return trainer.model().backend().host_copy<float>(trainer.model().weights());
  }
};

}  // namespace

TEST_CASE("training on device memory gives the CPU backend's losses and weights bit for bit",
          "[trainer][device]") {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    const TrainSpec spec = small_spec(dtype);
    FarBackend far;
    Run cpu(spec, cpu_backend()), dev(spec, far);
    CHECK(dev.weights() == cpu.weights());  // the same initial weights for the same seed
    for (int step = 0; step < 4; ++step) {
      const auto b = batches(spec, step);
      const StepStats c = cpu.trainer.step(b), d = dev.trainer.step(b);
      CHECK(d.loss == c.loss);
      CHECK(d.grad_norm == c.grad_norm);
    }
    CHECK(dev.weights() == cpu.weights());
  }
}

TEST_CASE("a staged communicator copies only what the inner one cannot take", "[trainer][device][comm]") {
  FarBackend far;
  auto comm = staged_comm(self_comm(), far, CommMemory::kHost);
  double host = 2.5;
  comm->all_reduce(&host, 1, CommType::kF64, ReduceOp::kSum)->wait();
  CHECK(host == 2.5);
  CHECK(far.host_copies() == 0);

  Buffer<float> values = far.alloc<float>(4);
  const float in[4] = {1, 2, 3, 4};
  far.copy_from_host(values.data(), in, sizeof in);
  Buffer<float> gathered = far.alloc<float>(4);
  const int64_t before = far.host_copies();
  auto request = comm->all_gather(values.data(), gathered.data(), 4, CommType::kF32);
  request->wait();
  CHECK(far.host_copies() - before == 2);  // the input to host memory, the output back
  CHECK(far.host_copy<float>(gathered.span()) == std::vector<float>(in, in + 4));
  // A split communicator stages alike; a rank outside any group gets none.
  auto part = comm->split(0, 0, "part");
  REQUIRE(part != nullptr);
  part->all_reduce(values.data(), 4, CommType::kF32, ReduceOp::kSum)->wait();
  CHECK(far.host_copy<float>(values.span()) == std::vector<float>(in, in + 4));
  CHECK(comm->split(-1, 0, "none") == nullptr);
}

TEST_CASE("a staged communicator reuses its staging memory once a call completes",
          "[trainer][device][comm]") {
  FarBackend far;
  std::vector<float> ramp(64);
  std::iota(ramp.begin(), ramp.end(), 1.0f);
  Buffer<float> values = far.alloc<float>(64);
  far.copy_from_host(values.data(), ramp.data(), 64 * sizeof(float));
  std::vector<float> host = ramp;
  // The host-staged MPI on GPUs (device buffers through host memory) and NCCL (host values through device
  // memory), each with a communicator split from it.
  for (const CommMemory takes : {CommMemory::kHost, CommMemory::kDevice}) {
    auto comm = staged_comm(self_comm(), far, takes);
    auto part = comm->split(0, 0, "part");
    REQUIRE(part != nullptr);
    const auto start = [&](Comm& c) {
      float* data = takes == CommMemory::kHost ? values.data() : host.data();
      return c.all_reduce(data, 64, CommType::kF32, ReduceOp::kSum);
    };
    start(*comm)->wait();
    const int64_t after_first = far.allocations();
    for (int i = 0; i < 3; ++i) {
      start(*comm)->wait();
      start(*part)->wait();
    }
    CHECK(far.allocations() == after_first);
    // A call that has not completed keeps its staging: the one after it gets memory of its own.
    RequestPtr pending = start(*comm);
    start(*comm)->wait();
    CHECK(far.allocations() == after_first + 1);
    pending->wait();
    pending.reset();
    // Reused staging carries nothing over: new values reach it (an all-reduce over one rank gives them
    // back), not those of the call that used it before.
    std::vector<float> doubled = ramp;
    for (float& v : doubled) v *= 2;
    far.copy_from_host(values.data(), doubled.data(), 64 * sizeof(float));
    host = doubled;
    start(*comm)->wait();
    CHECK(far.allocations() == after_first + 1);
    CHECK((takes == CommMemory::kHost ? far.host_copy<float>(values.span()) : host) == doubled);
    far.copy_from_host(values.data(), ramp.data(), 64 * sizeof(float));
    host = ramp;
  }
}

TEST_CASE("a checkpoint saved from device memory resumes on the CPU, and the other way",
          "[trainer][device][ckpt]") {
  // BF16 too: the resumed model's working copy is rewritten from the checkpoint, and the device's own copy
  // of it with it (bf16_working_copy), or the next steps would differ.
  const DType dtype = GENERATE(DType::kF32, DType::kBF16);
  const TrainSpec spec = small_spec(dtype);
  FarBackend far;
  forge::test::TempDir dir;
  Run dev(spec, far);
  for (int step = 0; step < 3; ++step) dev.trainer.step(batches(spec, step));

  // Saved the way forge-train saves from a GPU: the snapshot is the backend's copy into its host memory.
  forge::ckpt::SingleProcessCoordinator coord;
  forge::ckpt::SaverOptions options{.run_dir = dir.path().string()};
  snapshot_through(far, options);
  REQUIRE(options.read_piece);
  forge::ckpt::Saver saver(coord, options);
  forge::ckpt::CheckpointMeta meta;
  meta.step = 3;
  meta.model_config = model_spec_json(spec.model);
  const auto event = saver.save(forge::ckpt::Tier::kMilestone, meta,
                                checkpoint_tensors(dev.trainer.model(), &dev.trainer.optimizer()));
  REQUIRE(event.outcome == forge::ckpt::Outcome::kCommitted);
  const auto checkpoint = forge::ckpt::Checkpoint::open(event.path);
  checkpoint.verify();

  // On the CPU, and again on device memory: the same weights and moments, and the same next steps.
  Run cpu(spec, cpu_backend()), back(spec, far);
  for (Run* r : {&cpu, &back}) {
    load_checkpoint(checkpoint, r->trainer.model(), &r->trainer.optimizer());
    r->trainer.optimizer().restore_steps(3);
    CHECK(r->weights() == dev.weights());
  }
  Backend& cpu_memory = cpu_backend();
  CHECK(cpu_memory.host_copy<float>(cpu.trainer.optimizer().m()) ==
        far.host_copy<float>(dev.trainer.optimizer().m()));
  for (int step = 3; step < 5; ++step) {
    const auto b = batches(spec, step);
    const double want = dev.trainer.step(b).loss;
    CHECK(cpu.trainer.step(b).loss == want);
    CHECK(back.trainer.step(b).loss == want);
  }
}

TEST_CASE("released host memory reads as zeros and leaves the resident pages (ZeRO-2/3)",
          "[trainer][memory]") {
  Backend& cpu = cpu_backend();
  // Where the range starts in its first page varies with the allocator: each start is tried, since the
  // counts must hold for the bytes of the range, not for the pages it touches.
  const size_t shift = GENERATE(size_t{0}, size_t{1}, kReleaseFloats / 2 + 3);
  const size_t n = 64 * kReleaseFloats + 100;
  Buffer<float> buffer = cpu.alloc<float>(n + shift);
  float* b = buffer.data() + shift;
  std::fill(b, b + n, 1.0f);
  const size_t before = cpu.resident_bytes(b, n);
  CHECK(before == n * sizeof(float));
  // 40 pages' worth from an unaligned start: the whole pages inside go back, the edges are zeroed in place.
  const size_t lo = 10 * kReleaseFloats + 7, len = 40 * kReleaseFloats;
  cpu.release(b + lo, len);
  const size_t after = cpu.resident_bytes(b, n);  // before reading: a read maps the zero page
  CHECK(before - after >= 39 * kReleaseFloats * sizeof(float));
  CHECK(before - after <= len * sizeof(float));
  for (size_t i = 0; i < n; ++i) {
    const bool released = i >= lo && i < lo + len;
    if (b[i] != (released ? 0.0f : 1.0f)) FAIL("element " << i << " is " << b[i]);
  }
  // Written again, the pages come back.
  std::fill(b + lo, b + lo + len, 2.0f);
  CHECK(cpu.resident_bytes(b, n) == before);
  // A range inside one page is only zeroed.
  cpu.release(b + 3, 5);
  CHECK(b[2] == 1.0f);
  CHECK(b[3] == 0.0f);
  CHECK(b[8] == 1.0f);
}
