// How the ranks of one job agree during a save or a resume, without the checkpoint module depending on
// MPI: the trainer implements this over its communicator. Every call is collective (all ranks call it,
// in the same order) and is made only from the thread that calls Saver/resume functions, never from the
// background writer, so the communicator needs no MPI_THREAD_MULTIPLE.
#pragma once

#include <string>
#include <vector>

namespace forge::ckpt {

class Coordinator {
 public:
  virtual ~Coordinator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank's `mine`, in rank order, on rank 0; an empty vector elsewhere.
  virtual std::vector<std::string> gather(const std::string& mine) = 0;
  // Rank 0's `value` on every rank (the argument is ignored elsewhere).
  virtual std::string broadcast(const std::string& value) = 0;
};

// One process is the whole job.
class SingleProcessCoordinator final : public Coordinator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::vector<std::string> gather(const std::string& mine) override { return {mine}; }
  std::string broadcast(const std::string& value) override { return value; }
};

// True on every rank when `mine` is true on every rank.
bool all_true(Coordinator& coord, bool mine);

}  // namespace forge::ckpt
