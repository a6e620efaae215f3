// Context parallelism (parallel.cp): each sequence is cut into 2·cp equal chunks and cp rank r holds
// chunks r and 2·cp − 1 − r, so that under the causal mask every rank does the same attention work (the
// early chunks see few keys, the late ones many). Everything but attention works on its rows alone; the
// attention slot passes key/value chunks around the cp group and merges the partial results by their
// log-sum-exps (parallel.cp_comm = ring), or turns chunks of every head into whole sequences of 1/cp of
// the heads by all-to-all (a2a): src/parallel/context_attention.h.
//
//   sequence  | c0 | c1 | c2 | c3 |      cp = 2: rank 0 holds c0 c3, rank 1 holds c1 c2
//   ring step 0: each rank attends over its own chunks; step s: over rank (r − s)'s, received from r − 1
//   while the previous block computes, and passed on to r + 1.
#pragma once

#include "forge/common/batch.h"

namespace forge::trainer {

// The sequence index of the first position of chunk c (0 or 1) of cp rank `rank`, chunks of n positions.
constexpr int context_chunk_first(int cp, int rank, int c, int n) {
  return (c == 0 ? rank : 2 * cp - 1 - rank) * n;
}

// cp rank `rank`'s part of a batch: of every row, its two chunks back to back (seq_len / cp positions),
// with explicit targets, the true positions (rotary and learned position tables read them), the loss
// weights, the document ids as the whole row numbers them, the sample ids and a DPO pair's reference
// log-probabilities. seq_len must divide by 2·cp.
MicroBatch context_shard(const MicroBatch& full, int cp, int rank);

}  // namespace forge::trainer
