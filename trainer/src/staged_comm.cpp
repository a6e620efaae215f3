#include "forge/trainer/staged_comm.h"

#include <cstddef>
#include <numeric>
#include <span>
#include <vector>

namespace forge::trainer {

namespace {

// One caller buffer in staging memory of the other kind, copied back on completion when it is an output.
class Staged {
 public:
  Staged(Backend& backend, void* original, bool on_device, size_t bytes, bool output, bool copy_in)
      : backend_(backend), original_(original), bytes_(bytes), output_(output) {
    if (on_device) {
      host_.resize(bytes);
      if (copy_in) backend.copy_to_host(host_.data(), original, bytes);
    } else {
      device_ = backend.alloc<std::byte>(bytes);
      if (copy_in) backend.copy_from_host(device_.data(), original, bytes);
    }
  }
  void* at() { return host_.empty() ? static_cast<void*>(device_.data()) : host_.data(); }
  void finish() {
    if (!output_) return;
    if (host_.empty())
      backend_.copy_to_host(original_, device_.data(), bytes_);
    else
      backend_.copy_from_host(original_, host_.data(), bytes_);
  }

 private:
  Backend& backend_;
  void* original_;
  size_t bytes_;
  bool output_;
  std::vector<std::byte> host_;
  Buffer<std::byte> device_;
};

class StagedRequest final : public Request {
 public:
  StagedRequest(RequestPtr inner, std::vector<std::unique_ptr<Staged>> staged)
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
  RequestPtr inner_;
  std::vector<std::unique_ptr<Staged>> staged_;
  bool done_ = false;
};

class StagedComm final : public Comm {
 public:
  StagedComm(std::unique_ptr<Comm> inner, Backend& backend, CommMemory takes)
      : inner_(std::move(inner)), backend_(backend), takes_(takes) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  CommStats& stats() override { return inner_->stats(); }

  RequestPtr all_reduce(void* data, size_t count, CommType type, ReduceOp op) override {
    Stages s(*this);
    void* d = s.inout(data, count * comm_type_size(type));
    return s.done(inner_->all_reduce(d, count, type, op));
  }
  RequestPtr reduce_scatter(const void* in, void* out, size_t count, CommType type) override {
    Stages s(*this);
    const size_t bytes = count * comm_type_size(type);
    const void* i = s.in(in, bytes * size_t(size()));
    void* o = s.out(out, bytes);
    return s.done(inner_->reduce_scatter(i, o, count, type));
  }
  RequestPtr all_gather(const void* in, void* out, size_t count, CommType type) override {
    Stages s(*this);
    const size_t bytes = count * comm_type_size(type);
    const void* i = s.in(in, bytes);
    void* o = s.out(out, bytes * size_t(size()));
    return s.done(inner_->all_gather(i, o, count, type));
  }
  RequestPtr broadcast(void* data, size_t count, CommType type, int root) override {
    Stages s(*this);
    void* d = s.inout(data, count * comm_type_size(type));
    return s.done(inner_->broadcast(d, count, type, root));
  }
  RequestPtr all_to_all_v(const void* in, const size_t* send_counts, void* out, const size_t* recv_counts,
                          CommType type) override {
    Stages s(*this);
    const size_t n = size_t(size()), bytes = comm_type_size(type);
    const void* i = s.in(in, std::accumulate(send_counts, send_counts + n, size_t{0}) * bytes);
    void* o = s.out(out, std::accumulate(recv_counts, recv_counts + n, size_t{0}) * bytes);
    return s.done(inner_->all_to_all_v(i, send_counts, o, recv_counts, type));
  }
  RequestPtr send(const void* data, size_t count, CommType type, int peer, int tag) override {
    Stages s(*this);
    const void* d = s.in(data, count * comm_type_size(type));
    return s.done(inner_->send(d, count, type, peer, tag));
  }
  RequestPtr recv(void* data, size_t count, CommType type, int peer, int tag) override {
    Stages s(*this);
    void* d = s.out(data, count * comm_type_size(type));
    return s.done(inner_->recv(d, count, type, peer, tag));
  }
  void barrier() override { inner_->barrier(); }
  std::unique_ptr<Comm> split(int color, int key, const std::string& name) override {
    std::unique_ptr<Comm> part = inner_->split(color, key, name);
    return part ? staged_comm(std::move(part), backend_, takes_) : nullptr;
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
    RequestPtr done(RequestPtr r) {
      if (staged_.empty()) return r;
      return std::make_unique<StagedRequest>(std::move(r), std::move(staged_));
    }

   private:
    void* stage(void* p, size_t bytes, bool output, bool copy_in) {
      if (p == nullptr || bytes == 0) return p;
      const bool device = c_.backend_.device_memory(p);
      if (device == (c_.takes_ == CommMemory::kDevice)) return p;
      staged_.push_back(std::make_unique<Staged>(c_.backend_, p, device, bytes, output, copy_in));
      return staged_.back()->at();
    }
    StagedComm& c_;
    std::vector<std::unique_ptr<Staged>> staged_;
  };

  std::unique_ptr<Comm> inner_;
  Backend& backend_;
  CommMemory takes_;
};

}  // namespace

std::unique_ptr<Comm> staged_comm(std::unique_ptr<Comm> inner, Backend& backend, CommMemory takes) {
  return std::make_unique<StagedComm>(std::move(inner), backend, takes);
}

}  // namespace forge::trainer
