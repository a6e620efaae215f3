// What this process is doing right now, for the watchdog. The training loop and the communicators mark
// each operation they start (a static string such as "all_reduce dp", "recv pp from rank 3", "forward
// step 12"); every mark is a heartbeat. A watchdog thread that sees no heartbeat for its timeout knows
// which operation hung. Marking costs two relaxed atomic stores.
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

namespace forge {

struct Activity {
  std::atomic<uint64_t> beats{0};
  std::atomic<const char*> what{"start-up"};
  std::atomic<int> peer{-1};  // the other rank of a send/recv, -1 when none
};

// The process-wide activity record.
Activity& activity();

// Whether an activity is a wait on other ranks (a collective, a send or receive, a barrier) rather than
// this rank's own work: the watchdog's failure record blames the peer of the first, the rank of the second.
inline bool is_communication(std::string_view what) {
  for (std::string_view op :
       {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv", "barrier"})
    if (what.substr(0, op.size()) == op) return true;
  return false;
}

// Marks the start of an operation (`what` must be a string literal or otherwise outlive the process).
inline void mark_activity(const char* what, int peer = -1) {
  Activity& a = activity();
  a.what.store(what, std::memory_order_relaxed);
  a.peer.store(peer, std::memory_order_relaxed);
  a.beats.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace forge
