// Multi-rank save and resharded load over real MPI processes: `save DIR` on 4 ranks (tp2 x dp2, ZeRO
// ranges), then `load DIR` on 2 ranks (tp1 x dp2) resumes, checks every element bit for bit, and checks
// that the post-load verification data came back.
#include "support.h"

#include "forge/ckpt/resume.h"

#include <mpi.h>

#include <cstdio>
#include <filesystem>

using namespace forge::ckpt;
using namespace forge::ckpt::test;

namespace {

// What the trainer would implement over its communicator.
class MpiCoordinator final : public Coordinator {
 public:
  explicit MpiCoordinator(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<std::string> gather(const std::string& mine) override {
    int n = static_cast<int>(mine.size());
    std::vector<int> sizes(size_), displs(size_);
    MPI_Gather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, comm_);
    std::string all;
    if (rank_ == 0) {
      int total = 0;
      for (int r = 0; r < size_; ++r) displs[r] = total, total += sizes[r];
      all.resize(total);
    }
    MPI_Gatherv(mine.data(), n, MPI_CHAR, all.data(), sizes.data(), displs.data(), MPI_CHAR, 0, comm_);
    std::vector<std::string> out;
    if (rank_ == 0)
      for (int r = 0; r < size_; ++r) out.push_back(all.substr(displs[r], sizes[r]));
    return out;
  }
  std::string broadcast(const std::string& value) override {
    int n = static_cast<int>(value.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, comm_);
    std::string out = rank_ == 0 ? value : std::string(n, '\0');
    MPI_Bcast(out.data(), n, MPI_CHAR, 0, comm_);
    return out;
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

int fail_with(const std::string& what) {
  std::fprintf(stderr, "mpi_reshard: %s\n", what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

int save(MpiCoordinator& coord, const std::string& run) {
  if (coord.size() != 4) return fail_with("save runs on 4 ranks");
  if (coord.rank() == 0) std::filesystem::remove_all(run);
  MPI_Barrier(MPI_COMM_WORLD);
  Saver saver(coord, SaverOptions{run});
  for (int64_t step : {10, 20}) {
    const RankState st = rank_state(2, 2, coord.rank(), step, 64);
    const SaveEvent e =
        saver.save_async(step == 20 ? Tier::kMilestone : Tier::kRecovery, meta_for(step, 2, 2), st.tensors());
    if (e.outcome != Outcome::kPending) return fail_with("save did not start: " + e.error);
  }
  const auto last = saver.wait();
  if (!last || last->outcome != Outcome::kCommitted) return fail_with("last save not committed");
  for (const auto& e : saver.take_events())
    if (e.outcome != Outcome::kCommitted)
      return fail_with("save of step " + std::to_string(e.step) + " failed: " + e.error);
  return 0;
}

int load(MpiCoordinator& coord, const std::string& run) {
  if (coord.size() != 2) return fail_with("load runs on 2 ranks");
  Expectations expect;
  expect.model_config = meta_for(0).model_config;
  expect.dataset_version = "ds-1";
  auto ckpt = open_for_resume(coord, run, expect);
  if (!ckpt) return fail_with("no checkpoint to resume from");
  if (ckpt->manifest().meta.step != 20 || ckpt->manifest().tier != "milestone")
    return fail_with("resumed from the wrong checkpoint " + ckpt->dir());
  if (ckpt->manifest().world_size != 4 || ckpt->manifest().meta.layout.dp != 2)
    return fail_with("the manifest does not record the saving layout");
  if (ckpt->verification_bytes() != "batch-bytes-20") return fail_with("verification batch lost");
  const RankState want = rank_state(1, 2, coord.rank(), 20, 64);
  std::vector<std::vector<float>> got(want.slices.size());
  std::vector<TensorRequest> req;
  for (size_t i = 0; i < want.slices.size(); ++i) {
    got[i].assign(want.data[i].size(), -1.0f);
    req.push_back(TensorRequest{want.slices[i], got[i].data()});
  }
  ckpt->read(req);
  for (size_t i = 0; i < want.slices.size(); ++i)
    if (got[i] != want.data[i])
      return fail_with("tensor " + want.slices[i].name + " differs after resharding");
  if (coord.rank() == 0) std::printf("resharded load of step 20 (4 ranks -> 2 ranks) is bit-exact\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
    MpiCoordinator coord(MPI_COMM_WORLD);
    if (argc != 3) return fail_with("usage: mpi_reshard save|load RUN_DIR");
    try {
      rc = std::string(argv[1]) == "save" ? save(coord, argv[2]) : load(coord, argv[2]);
    } catch (const std::exception& e) {
      return fail_with(e.what());
    }
  }
  MPI_Finalize();
  return rc;
}
