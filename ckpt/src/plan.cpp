#include "plan.h"

#include <fmt/ranges.h>

#include <algorithm>

namespace forge::ckpt::detail {

std::string part_file_name(int rank) {
  return fmt::format("rank-{:05d}.bin", rank);
}

uint64_t part_layout(const std::vector<Slice>& slices, const std::vector<char>& owned,
                     std::vector<uint64_t>* at) {
  uint64_t pos = 0;
  at->assign(slices.size(), 0);
  for (size_t i = 0; i < slices.size(); ++i) {
    if (!owned[i]) continue;
    (*at)[i] = pos;
    pos = align_up(pos + slices[i].bytes());
  }
  return pos;
}

SavePlan make_plan(const std::vector<std::vector<Slice>>& per_rank) {
  const int world = static_cast<int>(per_rank.size());
  SavePlan plan;
  plan.owned.resize(world);
  plan.file_bytes.assign(world, 0);

  // Replicas: identical geometry of the same tensor, held by several ranks.
  struct Holder {
    int rank;
    size_t index;
  };
  std::map<std::string, std::vector<Holder>> groups;
  std::map<std::string, std::pair<int, const Slice*>> first_seen;  // tensor -> (rank, slice)
  for (int r = 0; r < world; ++r) {
    plan.owned[r].assign(per_rank[r].size(), 0);
    for (size_t i = 0; i < per_rank[r].size(); ++i) {
      const Slice& s = per_rank[r][i];
      auto [it, fresh] = first_seen.emplace(s.name, std::make_pair(r, &s));
      if (!fresh && (it->second.second->dtype != s.dtype || it->second.second->shape != s.shape))
        fail(ExitCode::kUsage, "tensor '{}': rank {} saves it as {} {}, rank {} as {} {}", s.name,
             it->second.first, dtype_name(it->second.second->dtype), it->second.second->shape, r,
             dtype_name(s.dtype), s.shape);
      const std::string key = fmt::format("{}|{}|{}|{}|{}", s.name, fmt::join(s.offset, ","),
                                          fmt::join(s.count, ","), s.begin, s.end);
      groups[key].push_back(Holder{r, i});
    }
  }

  // Largest pieces first, each to its least-loaded holder: balances the write across replicas.
  std::vector<const std::vector<Holder>*> order;
  for (const auto& [key, holders] : groups) order.push_back(&holders);
  auto bytes_of = [&](const std::vector<Holder>* g) { return per_rank[(*g)[0].rank][(*g)[0].index].bytes(); };
  std::stable_sort(order.begin(), order.end(), [&](auto* a, auto* b) { return bytes_of(a) > bytes_of(b); });
  std::vector<uint64_t> load(world, 0);
  for (const auto* g : order) {
    const Holder* best = &(*g)[0];
    for (const Holder& h : *g)
      if (load[h.rank] < load[best->rank]) best = &h;
    plan.owned[best->rank][best->index] = 1;
    load[best->rank] += bytes_of(g);
  }

  std::vector<std::vector<uint64_t>> at(world);
  for (int r = 0; r < world; ++r) plan.file_bytes[r] = part_layout(per_rank[r], plan.owned[r], &at[r]);

  std::map<std::string, std::vector<int>> writer_of_piece;  // for messages
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < per_rank[r].size(); ++i) {
      if (!plan.owned[r][i]) continue;
      const Slice& s = per_rank[r][i];
      TensorEntry& t = plan.tensors[s.name];
      t.name = s.name;
      t.dtype = s.dtype;
      t.shape = s.shape;
      t.pieces.push_back(StoredPiece{s, part_file_name(r), at[r][i], runs_of(s)});
      writer_of_piece[s.name].push_back(r);
    }
  }
  for (const auto& [name, t] : plan.tensors) {
    const auto& writers = writer_of_piece[name];
    check_coverage(t, ExitCode::kUsage,
                   [&](size_t i) { return fmt::format("slice of rank {}", writers[i]); });
  }
  return plan;
}

}  // namespace forge::ckpt::detail
