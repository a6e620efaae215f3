#include "forge/comm/coordinator.h"

#include <algorithm>

namespace forge::comm {

std::vector<std::string> CommCoordinator::gather(const std::string& mine) {
  // Lengths first, then every string padded to the longest (the interface's all_gather has equal blocks).
  const int n = comm_.size();
  std::vector<int32_t> lengths(size_t(n), 0);
  int32_t len = int32_t(mine.size());
  comm_.all_gather(&len, lengths.data(), 1, CommType::kI32)->wait();
  const size_t longest = size_t(*std::max_element(lengths.begin(), lengths.end()));
  std::string padded = mine;
  padded.resize(longest);
  std::string all(longest * size_t(n), '\0');
  if (longest > 0) comm_.all_gather(padded.data(), all.data(), longest, CommType::kU8)->wait();
  if (comm_.rank() != 0) return {};
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) out.push_back(all.substr(size_t(r) * longest, size_t(lengths[size_t(r)])));
  return out;
}

std::string CommCoordinator::broadcast(const std::string& value) {
  int64_t len = comm_.rank() == 0 ? int64_t(value.size()) : 0;
  comm_.broadcast(&len, sizeof len, CommType::kU8, 0)->wait();
  std::string out = comm_.rank() == 0 ? value : std::string(size_t(len), '\0');
  if (len > 0) comm_.broadcast(out.data(), size_t(len), CommType::kU8, 0)->wait();
  return out;
}

}  // namespace forge::comm
