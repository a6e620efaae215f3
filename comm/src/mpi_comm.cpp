// The Comm interface over MPI (Open MPI on CPU ranks). Non-blocking MPI calls back every Request; errors
// come back as return codes (MPI_ERRORS_RETURN) and are thrown as forge::Error(kComm) naming the rank, the
// group and the call, so forge-train exits 69 rather than MPI aborting with its own code.
#include "forge/comm/groups.h"
#include "forge/common/activity.h"
#include "forge/common/error.h"
#include "forge/common/trace.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <vector>

namespace forge::comm {

namespace {

MPI_Datatype mpi_type(CommType type) {
  switch (type) {
    case CommType::kF32:
      return MPI_FLOAT;
    case CommType::kF64:
      return MPI_DOUBLE;
    case CommType::kI32:
      return MPI_INT32_T;
    case CommType::kU8:
      return MPI_BYTE;
    case CommType::kBF16:
      return MPI_UINT16_T;  // moved, never reduced on CPU ranks
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
  return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM;
}

int world_rank() {
  int r = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

void check(int rc, const char* call, const std::string& group) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail(ExitCode::kComm,
       "rank {}: {} on group '{}' failed: {} (a peer rank died or the network failed; see "
       "the other ranks' logs)",
       world_rank(), call, group, std::string(text, size_t(len)));
}

// "all_reduce dp": a name the watchdog can print after the request is gone (interned, never freed).
const char* describe(const char* op, const std::string& group) {
  static std::mutex mutex;
  static std::set<std::string> names;
  std::lock_guard lock(mutex);
  return names.insert(std::string(op) + " " + group).first->c_str();
}

int count_of(size_t n) {
  if (n > size_t(INT32_MAX)) throw std::invalid_argument("MPI message over 2^31 elements: split it");
  return int(n);
}

// Time in an MPI call counts as communication, not compute (CommStats::wait_s), and shows in the trace:
// blocking waits as "wait" spans, issuing and testing (where MPI progresses other operations) as "issue".
class InMpi {
 public:
  InMpi(CommStats& stats, const char* what, const char* cat)
      : stats_(stats), span_(what, cat), t0_(std::chrono::steady_clock::now()) {}
  ~InMpi() { stats_.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  CommStats& stats_;
  TraceSpan span_;
  std::chrono::steady_clock::time_point t0_;
};

class MpiRequest final : public Request {
 public:
  MpiRequest(MPI_Request r, CommStats& stats, const char* what, const std::string& group, int peer,
             uint64_t trace_id)
      : r_(r), stats_(stats), what_(what), group_(group), peer_(peer), trace_id_(trace_id) {}
  ~MpiRequest() override {
    // A request dropped unfinished (an exception unwinding) is completed, not leaked.
    if (r_ != MPI_REQUEST_NULL) MPI_Wait(&r_, MPI_STATUS_IGNORE);
  }
  void wait() override {
    if (r_ == MPI_REQUEST_NULL) return;
    mark_activity(what_, peer_);
    {
      InMpi in(stats_, what_, "wait");
      check(MPI_Wait(&r_, MPI_STATUS_IGNORE), what_, group_);
    }
    completed();
    mark_activity("compute");
  }
  bool test() override {
    if (r_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    {
      InMpi in(stats_, what_, "issue");
      check(MPI_Test(&r_, &done, MPI_STATUS_IGNORE), what_, group_);
    }
    if (done != 0) completed();
    return done != 0;
  }
  // Keeps what MPI reads until the operation completes (the count arrays of MPI_Ialltoallv).
  void keep(std::shared_ptr<void> state) { kept_ = std::move(state); }

 private:
  void completed() {
    if (trace_id_ != 0) Trace::async_end(trace_id_, what_);
    trace_id_ = 0;
  }

  MPI_Request r_;
  CommStats& stats_;
  const char* what_;
  const std::string& group_;
  int peer_;
  uint64_t trace_id_;  // the operation's trace event, 0 when not traced or already ended
  std::shared_ptr<void> kept_;
};

class MpiComm final : public Comm {
 public:
  MpiComm(MPI_Comm comm, std::string name, bool owned) : comm_(comm), name_(std::move(name)), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    // World ranks of this group's members: the watchdog names a hung send/recv's peer by its world rank.
    MPI_Group group, world;
    MPI_Comm_group(comm_, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> mine(size_t(size_), 0);
    for (int i = 0; i < size_; ++i) mine[size_t(i)] = i;
    world_ranks_.resize(size_t(size_));
    MPI_Group_translate_ranks(group, size_, mine.data(), world, world_ranks_.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world);
  }
  ~MpiComm() override {
    if (owned_) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  RequestPtr all_reduce(void* data, size_t count, CommType type, ReduceOp op) override {
    if (type == CommType::kBF16) throw std::invalid_argument("MPI communicator: no BF16 reductions on CPU");
    return issue("all_reduce", count * comm_type_size(type), [&](MPI_Request* r) {
      check(MPI_Iallreduce(MPI_IN_PLACE, data, count_of(count), mpi_type(type), mpi_op(op), comm_, r),
            "MPI_Iallreduce", name_);
    });
  }
  RequestPtr reduce_scatter(const void* in, void* out, size_t count, CommType type) override {
    return issue("reduce_scatter", count * size_t(size_) * comm_type_size(type), [&](MPI_Request* r) {
      check(MPI_Ireduce_scatter_block(in, out, count_of(count), mpi_type(type), MPI_SUM, comm_, r),
            "MPI_Ireduce_scatter_block", name_);
    });
  }
  RequestPtr all_gather(const void* in, void* out, size_t count, CommType type) override {
    // `in` may alias this rank's block of `out` (ZeRO gathers parameters in place).
    const char* mine = static_cast<const char*>(out) + size_t(rank_) * count * comm_type_size(type);
    const void* send = in == mine ? MPI_IN_PLACE : in;
    return issue("all_gather", count * size_t(size_) * comm_type_size(type), [&](MPI_Request* r) {
      check(MPI_Iallgather(send, count_of(count), mpi_type(type), out, count_of(count), mpi_type(type), comm_,
                           r),
            "MPI_Iallgather", name_);
    });
  }
  RequestPtr broadcast(void* data, size_t count, CommType type, int root) override {
    return issue("broadcast", rank_ == root ? count * comm_type_size(type) : 0, [&](MPI_Request* r) {
      check(MPI_Ibcast(data, count_of(count), mpi_type(type), root, comm_, r), "MPI_Ibcast", name_);
    });
  }
  RequestPtr all_to_all_v(const void* in, const size_t* send_counts, void* out, const size_t* recv_counts,
                          CommType type) override {
    // MPI takes int counts and displacements; they live with the request (MPI reads them until done).
    auto counts = std::make_shared<std::vector<int>>(4 * size_t(size_));
    int* sc = counts->data();
    int *sd = sc + size_, *rc = sd + size_, *rd = rc + size_;
    size_t sent = 0, at_send = 0, at_recv = 0;
    for (int r = 0; r < size_; ++r) {
      sc[r] = count_of(send_counts[r]);
      rc[r] = count_of(recv_counts[r]);
      sd[r] = count_of(at_send);
      rd[r] = count_of(at_recv);
      at_send += send_counts[r];
      at_recv += recv_counts[r];
      sent += send_counts[r];
    }
    RequestPtr request = issue("all_to_all_v", sent * comm_type_size(type), [&](MPI_Request* r) {
      check(MPI_Ialltoallv(in, sc, sd, mpi_type(type), out, rc, rd, mpi_type(type), comm_, r),
            "MPI_Ialltoallv", name_);
    });
    static_cast<MpiRequest&>(*request).keep(std::move(counts));
    return request;
  }
  RequestPtr send(const void* data, size_t count, CommType type, int peer, int tag) override {
    return issue(
        "send", count * comm_type_size(type),
        [&](MPI_Request* r) {
          check(MPI_Isend(data, count_of(count), mpi_type(type), peer, tag, comm_, r), "MPI_Isend", name_);
        },
        peer);
  }
  RequestPtr recv(void* data, size_t count, CommType type, int peer, int tag) override {
    return issue(
        "recv", 0,
        [&](MPI_Request* r) {
          check(MPI_Irecv(data, count_of(count), mpi_type(type), peer, tag, comm_, r), "MPI_Irecv", name_);
        },
        peer, count * comm_type_size(type));
  }
  void barrier() override {
    mark_activity("barrier");
    check(MPI_Barrier(comm_), "MPI_Barrier", name_);
  }
  std::unique_ptr<Comm> split(int color, int key, const std::string& name) override {
    MPI_Comm out;
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &out), "MPI_Comm_split", name_);
    if (out == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiComm>(out, name, true);
  }
  void abort(int exit_code) override { MPI_Abort(comm_, exit_code); }

 private:
  // Starts an operation: `sent` is the payload this rank sends (the metrics' bytes), `moved` what the trace
  // shows when more (a receive counts what arrives).
  template <typename Start>
  RequestPtr issue(const char* what, size_t sent, Start&& start, int peer = -1, size_t moved = 0) {
    stats_.bytes += sent;
    ++stats_.calls;
    const char* described = describe(what, name_);
    const int world_peer = peer < 0 ? -1 : world_ranks_[size_t(peer)];
    const uint64_t id = Trace::on() ? Trace::async_begin(described, std::max(sent, moved), world_peer) : 0;
    MPI_Request r = MPI_REQUEST_NULL;
    {
      InMpi in(stats_, described, "issue");
      start(&r);
    }
    return std::make_unique<MpiRequest>(r, stats_, described, name_, world_peer, id);
  }

  MPI_Comm comm_;
  std::string name_;
  bool owned_;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;
};

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized == 0) MPI_Finalize();
}

}  // namespace

std::unique_ptr<Comm> mpi_world() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      fail(ExitCode::kComm, "MPI_Init_thread failed (start under srun --mpi=pmix or mpirun)");
    std::atexit(finalize_mpi);
  }
  return std::make_unique<MpiComm>(MPI_COMM_WORLD, "world", false);
}

std::string mpi_host_name() {
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  return {name, size_t(len)};
}

}  // namespace forge::comm
