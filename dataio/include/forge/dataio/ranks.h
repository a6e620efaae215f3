// The ranks of a distributed `forge-data prepare` (docs/DATA.md, "Distributed prepare"). Every rank holds a
// contiguous part of the corpus in input order, so a document's global index (its rank's offset plus its
// place there) is its place in the input, and "the first copy is kept" means the same thing on 1 rank and
// on N. The stages need one collective: each rank hands every rank a block of bytes. forge-data implements
// it over MPI; one process uses single_rank(), whose exchange hands the block back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace forge::data {

class Ranks {
 public:
  virtual ~Ranks() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // blocks[r] goes to rank r (blocks.size() == size()); returns the blocks each rank sent this one, by
  // rank. Collective: every rank calls it, in the same order.
  virtual std::vector<std::string> exchange(std::vector<std::string> blocks) = 0;

  // Everyone's `block`, by rank.
  std::vector<std::string> all_gather(const std::string& block);
  // Sum over the ranks (counts and byte totals).
  uint64_t sum(uint64_t value);
  // Bytes this rank has sent to other ranks so far (the cost a distributed prepare adds).
  uint64_t bytes_sent() const { return bytes_sent_; }

 protected:
  uint64_t bytes_sent_ = 0;
};

Ranks& single_rank();

}  // namespace forge::data
