// The defaults of the Comm interface (comm.h).
#include "forge/comm/comm.h"

namespace forge::comm {

namespace {
// Both halves of an exchange.
class PairRequest final : public Request {
 public:
  PairRequest(RequestPtr received, RequestPtr sent)
      : received_(std::move(received)), sent_(std::move(sent)) {}
  void wait() override {
    received_->wait();
    sent_->wait();
  }
  bool test() override {
    const bool received = received_->test();  // both, so that each makes progress
    return sent_->test() && received;
  }

 private:
  RequestPtr received_, sent_;
};
}  // namespace

RequestPtr Comm::exchange(const void* out, void* in, size_t count, CommType type, int to, int from, int tag) {
  RequestPtr received = recv(in, count, type, from, tag);
  return std::make_unique<PairRequest>(std::move(received), send(out, count, type, to, tag));
}

}  // namespace forge::comm
