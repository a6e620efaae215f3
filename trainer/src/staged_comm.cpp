#include "forge/trainer/staged_comm.h"

#include <cstddef>
#include <numeric>
#include <span>
#include <vector>

namespace forge::trainer {

namespace {

// Staging memory, kept for the next call once a call is done with it (best fit by size; a step stages the
// same sizes every time). Allocating per call would cost more than the copies: on a GPU, freeing device
// memory waits for every stream (the host-value collectives of each step would wait for the communication
// the step overlaps), and page-locked host memory, which the copies need at full speed, is slow to get.
// Shared by a communicator and those split from it (called, as they are, from the training thread).
class StagingPool {
 public:
  explicit StagingPool(Backend& backend) : backend_(backend) {}
  struct Block {
    std::unique_ptr<Allocation> memory;
    size_t bytes = 0;
  };
  Block take(size_t bytes, bool device) {
    std::vector<Block>& free = device ? device_ : host_;
    auto best = free.end();
    for (auto it = free.begin(); it != free.end(); ++it)
      if (it->bytes >= bytes && (best == free.end() || it->bytes < best->bytes)) best = it;
    if (best == free.end()) return {device ? backend_.allocate(bytes) : backend_.allocate_host(bytes), bytes};
    Block b = std::move(*best);
    free.erase(best);
    return b;
  }
  void give(Block b, bool device) { (device ? device_ : host_).push_back(std::move(b)); }
  Backend& backend() { return backend_; }

 private:
  Backend& backend_;
  std::vector<Block> device_, host_;
};

// One caller buffer in staging memory of the other kind, copied back on completion when it is an output.
// Its staging goes back to the pool only once the call completed: memory an unfinished call may still
// read or write is freed instead.
class Staged {
 public:
  Staged(std::shared_ptr<StagingPool> pool, void* original, bool on_device, size_t bytes, bool output,
         bool copy_in)
      : pool_(std::move(pool)),
        original_(original),
        bytes_(bytes),
        output_(output),
        device_staging_(!on_device),
        block_(pool_->take(bytes, device_staging_)) {
    if (!copy_in) return;
    if (device_staging_)
      pool_->backend().copy_from_host(at(), original, bytes);
    else
      pool_->backend().copy_to_host(at(), original, bytes);
  }
  ~Staged() {
    if (finished_) pool_->give(std::move(block_), device_staging_);
  }
  void* at() { return block_.memory->data(); }
  void finish() {
    finished_ = true;
    if (!output_) return;
    if (device_staging_)
      pool_->backend().copy_to_host(original_, at(), bytes_);
    else
      pool_->backend().copy_from_host(original_, at(), bytes_);
  }

 private:
  std::shared_ptr<StagingPool> pool_;
  void* original_;
  size_t bytes_;
  bool output_, device_staging_;
  StagingPool::Block block_;
  bool finished_ = false;
};

class StagedRequest final : public comm::Request {
 public:
  StagedRequest(comm::RequestPtr inner, std::vector<std::unique_ptr<Staged>> staged)
      : inner_(std::move(inner)), staged_(std::move(staged)) {}
  void wait() override {
    inner_->wait();
    finish();
  }
  bool test() override {
    if (!done_ && !inner_->test()) return false;
    finish();
    return true;
  }

 private:
  void finish() {
    if (done_) return;
    done_ = true;
    for (auto& s : staged_) s->finish();
  }
  comm::RequestPtr inner_;
  std::vector<std::unique_ptr<Staged>> staged_;
  bool done_ = false;
};

class StagedComm final : public comm::Comm {
 public:
  StagedComm(std::unique_ptr<comm::Comm> inner, std::shared_ptr<StagingPool> pool, CommMemory takes)
      : inner_(std::move(inner)), pool_(std::move(pool)), takes_(takes) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  comm::CommStats& stats() override { return inner_->stats(); }

  comm::RequestPtr all_reduce(void* data, size_t count, comm::CommType type, comm::ReduceOp op) override {
    Stages s(*this);
    void* d = s.inout(data, count * comm::comm_type_size(type));
    return s.done(inner_->all_reduce(d, count, type, op));
  }
  comm::RequestPtr reduce_scatter(const void* in, void* out, size_t count, comm::CommType type) override {
    Stages s(*this);
    const size_t bytes = count * comm::comm_type_size(type);
    const void* i = s.in(in, bytes * size_t(size()));
    void* o = s.out(out, bytes);
    return s.done(inner_->reduce_scatter(i, o, count, type));
  }
  comm::RequestPtr all_gather(const void* in, void* out, size_t count, comm::CommType type) override {
    Stages s(*this);
    const size_t bytes = count * comm::comm_type_size(type);
    const void* i = s.in(in, bytes);
    void* o = s.out(out, bytes * size_t(size()));
    return s.done(inner_->all_gather(i, o, count, type));
  }
  comm::RequestPtr broadcast(void* data, size_t count, comm::CommType type, int root) override {
    Stages s(*this);
    void* d = s.inout(data, count * comm::comm_type_size(type));
    return s.done(inner_->broadcast(d, count, type, root));
  }
  comm::RequestPtr all_to_all_v(const void* in, const size_t* send_counts, void* out,
                                const size_t* recv_counts, comm::CommType type) override {
    Stages s(*this);
    const size_t n = size_t(size()), bytes = comm::comm_type_size(type);
    const void* i = s.in(in, std::accumulate(send_counts, send_counts + n, size_t{0}) * bytes);
    void* o = s.out(out, std::accumulate(recv_counts, recv_counts + n, size_t{0}) * bytes);
    return s.done(inner_->all_to_all_v(i, send_counts, o, recv_counts, type));
  }
  comm::RequestPtr send(const void* data, size_t count, comm::CommType type, int peer, int tag) override {
    Stages s(*this);
    const void* d = s.in(data, count * comm::comm_type_size(type));
    return s.done(inner_->send(d, count, type, peer, tag));
  }
  comm::RequestPtr recv(void* data, size_t count, comm::CommType type, int peer, int tag) override {
    Stages s(*this);
    void* d = s.out(data, count * comm::comm_type_size(type));
    return s.done(inner_->recv(d, count, type, peer, tag));
  }
  comm::RequestPtr exchange(const void* out, void* in, size_t count, comm::CommType type, int to, int from,
                            int tag) override {
    Stages s(*this);
    const size_t bytes = count * comm::comm_type_size(type);
    const void* o = s.in(out, bytes);
    void* i = s.out(in, bytes);
    return s.done(inner_->exchange(o, i, count, type, to, from, tag));
  }
  void barrier() override { inner_->barrier(); }
  std::unique_ptr<comm::Comm> split(int color, int key, const std::string& name) override {
    std::unique_ptr<comm::Comm> part = inner_->split(color, key, name);
    return part ? std::make_unique<StagedComm>(std::move(part), pool_, takes_) : nullptr;
  }
  void abort(int exit_code) override { inner_->abort(exit_code); }

 private:
  // The stagings of one call: buffers the inner communicator can take pass through.
  class Stages {
   public:
    explicit Stages(StagedComm& c) : c_(c) {}
    const void* in(const void* p, size_t bytes) { return stage(const_cast<void*>(p), bytes, false, true); }
    void* out(void* p, size_t bytes) { return stage(p, bytes, true, false); }
    void* inout(void* p, size_t bytes) { return stage(p, bytes, true, true); }
    comm::RequestPtr done(comm::RequestPtr r) {
      if (staged_.empty()) return r;
      return std::make_unique<StagedRequest>(std::move(r), std::move(staged_));
    }

   private:
    void* stage(void* p, size_t bytes, bool output, bool copy_in) {
      if (p == nullptr || bytes == 0) return p;
      const bool device = c_.pool_->backend().device_memory(p);
      if (device == (c_.takes_ == CommMemory::kDevice)) return p;
      staged_.push_back(std::make_unique<Staged>(c_.pool_, p, device, bytes, output, copy_in));
      return staged_.back()->at();
    }
    StagedComm& c_;
    std::vector<std::unique_ptr<Staged>> staged_;
  };

  std::unique_ptr<comm::Comm> inner_;
  std::shared_ptr<StagingPool> pool_;
  CommMemory takes_;
};

}  // namespace

std::unique_ptr<comm::Comm> staged_comm(std::unique_ptr<comm::Comm> inner, Backend& backend,
                                        CommMemory takes) {
  return std::make_unique<StagedComm>(std::move(inner), std::make_shared<StagingPool>(backend), takes);
}

}  // namespace forge::trainer
