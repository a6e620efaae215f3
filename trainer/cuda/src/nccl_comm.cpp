#include "forge/trainer/cuda/nccl_comm.h"

#include "forge/common/activity.h"
#include "forge/common/error.h"

#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <thread>

namespace forge::trainer::cuda {

namespace {

ncclDataType_t nccl_type(comm::CommType t) {
  switch (t) {
    case comm::CommType::kF32:
      return ncclFloat32;
    case comm::CommType::kF64:
      return ncclFloat64;
    case comm::CommType::kBF16:
      return ncclBfloat16;
    case comm::CommType::kI32:
      return ncclInt32;
    case comm::CommType::kU8:
      return ncclUint8;
  }
  return ncclUint8;
}

class NcclComm;

class NcclRequest final : public comm::Request {
 public:
  NcclRequest(NcclComm* comm, cudaEvent_t event, const char* what)
      : comm_(comm), event_(event), what_(what) {}
  ~NcclRequest() override { cudaEventDestroy(event_); }
  void wait() override;
  bool test() override;

 private:
  NcclComm* comm_;
  cudaEvent_t event_;
  const char* what_;
  bool done_ = false;
};

class NcclComm final : public comm::Comm {
 public:
  NcclComm(ncclComm_t comm, int rank, int size, std::string name, cudaStream_t compute)
      : comm_(comm), rank_(rank), size_(size), name_(std::move(name)), compute_(compute) {
    cudaGetDevice(&device_);
    cuda("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    cuda("cudaEventCreateWithFlags", cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    cuda("cudaMalloc", cudaMalloc(&scratch_, sizeof(int)));
  }

  ~NcclComm() override {
    if (comm_ != nullptr) {
      // After a failure peers may be gone: only the non-blocking abort is safe then.
      if (failed_)
        ncclCommAbort(comm_);
      else
        ncclCommDestroy(comm_);
    }
    cudaFree(scratch_);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  comm::RequestPtr all_reduce(void* data, size_t count, comm::CommType type, comm::ReduceOp op) override {
    begin("nccl all_reduce", count * comm::comm_type_size(type));
    nccl("ncclAllReduce", ncclAllReduce(data, data, count, nccl_type(type),
                                        op == comm::ReduceOp::kSum ? ncclSum : ncclMax, comm_, stream_));
    return finish("ncclAllReduce");
  }
  comm::RequestPtr reduce_scatter(const void* in, void* out, size_t count, comm::CommType type) override {
    begin("nccl reduce_scatter", count * size_t(size_) * comm::comm_type_size(type));
    nccl("ncclReduceScatter", ncclReduceScatter(in, out, count, nccl_type(type), ncclSum, comm_, stream_));
    return finish("ncclReduceScatter");
  }
  comm::RequestPtr all_gather(const void* in, void* out, size_t count, comm::CommType type) override {
    begin("nccl all_gather", count * size_t(size_) * comm::comm_type_size(type));
    nccl("ncclAllGather", ncclAllGather(in, out, count, nccl_type(type), comm_, stream_));
    return finish("ncclAllGather");
  }
  comm::RequestPtr broadcast(void* data, size_t count, comm::CommType type, int root) override {
    begin("nccl broadcast", rank_ == root ? count * comm::comm_type_size(type) : 0);
    nccl("ncclBroadcast", ncclBroadcast(data, data, count, nccl_type(type), root, comm_, stream_));
    return finish("ncclBroadcast");
  }
  comm::RequestPtr all_to_all_v(const void* in, const size_t* send_counts, void* out,
                                const size_t* recv_counts, comm::CommType type) override {
    // NCCL has no all-to-all: one send and one receive per peer, grouped so they run as one operation.
    size_t sent = 0;
    for (int r = 0; r < size_; ++r) sent += send_counts[r];
    const size_t bytes = comm::comm_type_size(type);
    begin("nccl all_to_all_v", sent * bytes);
    nccl("ncclGroupStart", ncclGroupStart());
    size_t at_send = 0, at_recv = 0;
    for (int r = 0; r < size_; ++r) {
      if (send_counts[r] > 0)
        nccl("ncclSend", ncclSend(static_cast<const char*>(in) + at_send * bytes, send_counts[r],
                                  nccl_type(type), r, comm_, stream_));
      if (recv_counts[r] > 0)
        nccl("ncclRecv", ncclRecv(static_cast<char*>(out) + at_recv * bytes, recv_counts[r], nccl_type(type),
                                  r, comm_, stream_));
      at_send += send_counts[r];
      at_recv += recv_counts[r];
    }
    nccl("ncclGroupEnd", ncclGroupEnd());
    return finish("ncclGroupEnd (all_to_all_v)");
  }
  comm::RequestPtr send(const void* data, size_t count, comm::CommType type, int peer, int /*tag*/) override {
    // NCCL matches point-to-point calls by order between the pair, which comm.h already requires.
    begin("nccl send", count * comm::comm_type_size(type), peer);
    nccl("ncclSend", ncclSend(data, count, nccl_type(type), peer, comm_, stream_));
    return finish("ncclSend");
  }
  comm::RequestPtr recv(void* data, size_t count, comm::CommType type, int peer, int /*tag*/) override {
    begin("nccl recv", 0, peer);
    nccl("ncclRecv", ncclRecv(data, count, nccl_type(type), peer, comm_, stream_));
    return finish("ncclRecv");
  }
  // A ring's step: the send to `to` and the receive from `from` grouped into one operation. NCCL runs a
  // lone ncclSend until its receive is posted, so a ring in which every rank sends first would wait forever.
  comm::RequestPtr exchange(const void* out, void* in, size_t count, comm::CommType type, int to, int from,
                            int /*tag*/) override {
    begin("nccl exchange", count * comm::comm_type_size(type), to);
    nccl("ncclGroupStart", ncclGroupStart());
    if (count > 0) {
      nccl("ncclSend", ncclSend(out, count, nccl_type(type), to, comm_, stream_));
      nccl("ncclRecv", ncclRecv(in, count, nccl_type(type), from, comm_, stream_));
    }
    nccl("ncclGroupEnd", ncclGroupEnd());
    return finish("ncclGroupEnd (exchange)");
  }
  void barrier() override { all_reduce(scratch_, 1, comm::CommType::kI32, comm::ReduceOp::kSum)->wait(); }

  std::unique_ptr<comm::Comm> split(int color, int key, const std::string& name) override {
    mark_activity("nccl split");
    ncclComm_t sub = nullptr;
    // Collective over every rank; a negative color (NCCL_SPLIT_NOCOLOR) joins no group, as MPI_UNDEFINED.
    nccl("ncclCommSplit", ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, nullptr));
    if (color < 0 || sub == nullptr) return nullptr;
    int r = 0, n = 0;
    nccl("ncclCommUserRank", ncclCommUserRank(sub, &r));
    nccl("ncclCommCount", ncclCommCount(sub, &n));
    return std::make_unique<NcclComm>(sub, r, n, name, compute_);
  }

  void abort(int exit_code) override {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    std::_Exit(exit_code);
  }

  // Fails with the communicator's asynchronous error, if any.
  void check_async(const char* call) {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
    if (r != ncclSuccess) nccl("ncclCommGetAsyncError", r);
    if (async != ncclSuccess && async != ncclInProgress) nccl(call, async);
  }

  [[noreturn]] void error(const char* call, const std::string& what) {
    failed_ = true;
    fail(ExitCode::kComm, "NCCL group '{}' rank {}/{} on CUDA device {}: {} failed: {}", name_, rank_, size_,
         device_, call, what);
  }

  void nccl(const char* call, ncclResult_t r) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    const char* last = ncclGetLastError(comm_);
    error(call, std::string(ncclGetErrorString(r)) +
                    (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : ""));
  }

  void cuda(const char* call, cudaError_t e) {
    if (e != cudaSuccess) error(call, cudaGetErrorString(e));
  }

  void add_wait(double seconds) { stats_.wait_s += seconds; }

 private:
  void begin(const char* what, size_t bytes, int peer = -1) {
    mark_activity(what, peer);
    if (comm_ == nullptr) error(what, "the communicator was aborted");
    cuda("cudaEventRecord", cudaEventRecord(ready_, compute_));
    cuda("cudaStreamWaitEvent", cudaStreamWaitEvent(stream_, ready_, 0));
    stats_.bytes += bytes;
    ++stats_.calls;
  }

  comm::RequestPtr finish(const char* what) {
    cudaEvent_t done = nullptr;
    cuda("cudaEventCreateWithFlags", cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    cuda("cudaEventRecord", cudaEventRecord(done, stream_));
    return std::make_unique<NcclRequest>(this, done, what);
  }

  ncclComm_t comm_;
  int rank_, size_;
  std::string name_;
  cudaStream_t compute_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  void* scratch_ = nullptr;
  int device_ = -1;
  bool failed_ = false;
};

bool NcclRequest::test() {
  if (done_) return true;
  const cudaError_t q = cudaEventQuery(event_);
  if (q == cudaSuccess) return done_ = true;
  if (q != cudaErrorNotReady) comm_->cuda("cudaEventQuery", q);
  comm_->check_async(what_);
  return false;
}

void NcclRequest::wait() {
  const auto t0 = std::chrono::steady_clock::now();
  // Polling, not cudaEventSynchronize: a blocked synchronize would never see the asynchronous error.
  for (int spins = 0; !test(); ++spins)
    if (spins > 1000) std::this_thread::yield();
  comm_->add_wait(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace

std::unique_ptr<comm::Comm> make_nccl_comm(int rank, int size, const std::string& name,
                                           const BootstrapBroadcast& bcast, cudaStream_t compute) {
  int device = -1;
  cudaGetDevice(&device);
  const auto check = [&](const char* call, ncclResult_t r) {
    if (r != ncclSuccess)
      fail(ExitCode::kComm, "NCCL group '{}' rank {}/{} on CUDA device {}: {} failed: {}", name, rank, size,
           device, call, ncclGetErrorString(r));
  };
  if (size < 1 || rank < 0 || rank >= size)
    fail(ExitCode::kUsage, "NCCL group '{}': rank {} is outside [0, {})", name, rank, size);
  mark_activity("nccl init");
  ncclUniqueId id{};
  if (rank == 0) check("ncclGetUniqueId", ncclGetUniqueId(&id));
  if (size > 1) bcast(&id, sizeof(id));
  ncclComm_t comm = nullptr;
  check("ncclCommInitRank", ncclCommInitRank(&comm, size, id, rank));
  return std::make_unique<NcclComm>(comm, rank, size, name, compute);
}

}  // namespace forge::trainer::cuda
