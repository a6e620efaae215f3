// The communicator interface of the parallel runtime. Model and runtime code talk to a Comm and never to
// MPI or NCCL directly: the MPI implementation (CPU ranks) and the NCCL one (GPU ranks) plug in here.
//
// Every collective is asynchronous and returns a Request; the buffers passed in must stay alive and
// untouched until the request's wait() returns. Pointers are host memory for MPI and device memory for
// NCCL. Every call is collective over the communicator's ranks (send/recv: over the pair) and must be
// issued in the same order on every rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace forge::comm {

enum class CommType { kF32, kF64, kBF16, kI32, kU8 };

constexpr size_t comm_type_size(CommType type) {
  switch (type) {
    case CommType::kF64:
      return 8;
    case CommType::kF32:
    case CommType::kI32:
      return 4;
    case CommType::kBF16:
      return 2;
    case CommType::kU8:
      return 1;
  }
  return 1;
}

enum class ReduceOp { kSum, kMax };

class Request {
 public:
  virtual ~Request() = default;
  // Blocks until the operation is complete (its output readable, its input reusable).
  virtual void wait() = 0;
  // True once complete; drives progress without blocking.
  virtual bool test() = 0;
};
using RequestPtr = std::unique_ptr<Request>;

// What a communicator moved and how long its callers waited for it (for the per-step metrics).
struct CommStats {
  uint64_t bytes = 0;  // payload bytes this rank sent (collectives: its input size; all_gather: output)
  double wait_s = 0;   // time spent in the communicator's calls: issuing, testing, blocked in wait()
  uint64_t calls = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The group's role ("world", "tp", "dp", "pp", "embed"): named in errors and by the watchdog.
  virtual const std::string& name() const = 0;

  // In place over `count` elements.
  virtual RequestPtr all_reduce(void* data, size_t count, CommType type, ReduceOp op) = 0;
  // `in` holds size() blocks of `count` elements; rank r receives the sum of everyone's block r.
  virtual RequestPtr reduce_scatter(const void* in, void* out, size_t count, CommType type) = 0;
  // `out` receives size() blocks of `count` elements, block r from rank r.
  virtual RequestPtr all_gather(const void* in, void* out, size_t count, CommType type) = 0;
  virtual RequestPtr broadcast(void* data, size_t count, CommType type, int root) = 0;
  // send_counts[r] elements of `in` (back to back, in rank order) go to rank r; recv_counts[r] elements
  // arrive from rank r into `out`, back to back in rank order. Both count arrays (host memory, size()
  // entries) must agree with the peers' and stay alive until wait() returns.
  virtual RequestPtr all_to_all_v(const void* in, const size_t* send_counts, void* out,
                                  const size_t* recv_counts, CommType type) = 0;
  virtual RequestPtr send(const void* data, size_t count, CommType type, int peer, int tag) = 0;
  virtual RequestPtr recv(void* data, size_t count, CommType type, int peer, int tag) = 0;
  // Sends `count` elements of `out` to rank `to` and receives as many into `in` from rank `from`, as one
  // operation: a ring's step, where every rank sends and receives at once. NCCL runs a lone send or receive
  // to completion before the next call starts, so a ring of them would wait forever; this groups the pair
  // (the default: a receive and a send in flight together, as MPI's nonblocking calls are).
  virtual RequestPtr exchange(const void* out, void* in, size_t count, CommType type, int to, int from,
                              int tag);
  virtual void barrier() = 0;

  // A new communicator of the ranks that pass the same `color`, ordered by `key` (collective).
  virtual std::unique_ptr<Comm> split(int color, int key, const std::string& name) = 0;

  // Stops everything in flight without waiting for peers (the watchdog's last act; never blocks).
  virtual void abort(int exit_code) = 0;

  // A wrapper (staged_comm.h) reports its inner communicator's.
  virtual CommStats& stats() { return stats_; }

  // Blocking conveniences.
  void all_reduce_sum(float* data, size_t count) {
    all_reduce(data, count, CommType::kF32, ReduceOp::kSum)->wait();
  }
  double all_reduce_sum(double value) {
    all_reduce(&value, 1, CommType::kF64, ReduceOp::kSum)->wait();
    return value;
  }

 protected:
  CommStats stats_;
};

}  // namespace forge::comm
