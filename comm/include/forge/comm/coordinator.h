// The checkpoint library's Coordinator over a Comm, so saves and resumes agree across ranks without the
// checkpoint module knowing MPI.
#pragma once

#include "forge/ckpt/coordinator.h"
#include "forge/comm/comm.h"

namespace forge::comm {

class CommCoordinator final : public ckpt::Coordinator {
 public:
  explicit CommCoordinator(Comm& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  std::vector<std::string> gather(const std::string& mine) override;
  std::string broadcast(const std::string& value) override;

 private:
  Comm& comm_;
};

}  // namespace forge::comm
