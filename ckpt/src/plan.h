// Rank 0's plan for one save: which rank writes each piece (replicas, e.g. data-parallel copies of a
// parameter, are written once, by the replica holding the fewest bytes so far, so all ranks share the
// I/O), where it lands in that rank's part file, and the index describing it all.
#pragma once

#include "index.h"

#include <string>
#include <vector>

namespace forge::ckpt::detail {

struct SavePlan {
  std::vector<std::vector<char>> owned;  // [rank][slice]: 1 when this rank writes that slice
  std::vector<uint64_t> file_bytes;      // [rank]
  std::map<std::string, TensorEntry> tensors;
};

std::string part_file_name(int rank);

// Checks that every tensor has one dtype and shape across ranks and that the pieces cover it exactly
// (identical pieces are replicas; partial overlaps and gaps are errors), then assigns the writers.
// Throws forge::Error(kUsage) naming the tensor and the ranks.
SavePlan make_plan(const std::vector<std::vector<Slice>>& per_rank);

// Byte offsets of the owned slices in a rank's part file, in list order (64-byte aligned); returns the
// file size. Every rank computes its own with this, rank 0 all of them, so they agree.
uint64_t part_layout(const std::vector<Slice>& slices, const std::vector<char>& owned,
                     std::vector<uint64_t>* at);

}  // namespace forge::ckpt::detail
