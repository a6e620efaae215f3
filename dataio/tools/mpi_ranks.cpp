#include "mpi_ranks.h"

#include "forge/comm/groups.h"

#include <cstdlib>
#include <cstring>

namespace forge::data {
namespace {

using comm::CommType;

class MpiRanks final : public LauncherRanks {
 public:
  MpiRanks() : world_(comm::mpi_world()) {}
  int rank() const override { return world_->rank(); }
  int size() const override { return world_->size(); }

  std::vector<std::string> exchange(std::vector<std::string> blocks) override {
    const auto n = static_cast<size_t>(size());
    std::vector<uint64_t> send_bytes(n), recv_bytes(n);
    for (size_t r = 0; r < n; ++r) {
      send_bytes[r] = blocks[r].size();
      if (r != static_cast<size_t>(rank())) bytes_sent_ += blocks[r].size();
    }
    const std::vector<size_t> eights(n, sizeof(uint64_t));
    world_->all_to_all_v(send_bytes.data(), eights.data(), recv_bytes.data(), eights.data(), CommType::kU8)
        ->wait();
    std::string in;
    for (const auto& b : blocks) in += b;
    std::vector<size_t> send_counts(send_bytes.begin(), send_bytes.end()),
        recv_counts(recv_bytes.begin(), recv_bytes.end());
    std::string out;
    for (size_t c : recv_counts) out.resize(out.size() + c);
    world_->all_to_all_v(in.data(), send_counts.data(), out.data(), recv_counts.data(), CommType::kU8)
        ->wait();
    std::vector<std::string> received(n);
    size_t at = 0;
    for (size_t r = 0; r < n; ++r) {
      received[r] = out.substr(at, recv_counts[r]);
      at += recv_counts[r];
    }
    return received;
  }

  [[noreturn]] void abort(int exit_code) override {
    world_->abort(exit_code);
    std::_Exit(exit_code);
  }

 private:
  std::unique_ptr<comm::Comm> world_;
};

}  // namespace

std::unique_ptr<LauncherRanks> launcher_ranks() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(var) != nullptr) return std::make_unique<MpiRanks>();
  return nullptr;
}

}  // namespace forge::data
