// Test helpers for the checkpoint module: an in-process multi-rank Coordinator (one thread per rank), a
// small model with deterministic contents, and its pieces under a (tp, dp) layout.
#pragma once

#include "forge/ckpt/coordinator.h"
#include "forge/ckpt/saver.h"
#include "forge/common/hash.h"

#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace forge::ckpt::test {

class ThreadGroup {
 public:
  explicit ThreadGroup(int n) : n_(n), slots_(n) {}
  void barrier() {
    std::unique_lock<std::mutex> lock(m_);
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != gen; });
    }
  }
  int n_;
  std::vector<std::string> slots_;
  std::string value_;

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

class ThreadCoordinator final : public Coordinator {
 public:
  ThreadCoordinator(ThreadGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.n_; }
  std::vector<std::string> gather(const std::string& mine) override {
    g_.slots_[rank_] = mine;
    g_.barrier();
    std::vector<std::string> out;
    if (rank_ == 0) out = g_.slots_;
    g_.barrier();
    return out;
  }
  std::string broadcast(const std::string& value) override {
    if (rank_ == 0) g_.value_ = value;
    g_.barrier();
    std::string out = g_.value_;
    g_.barrier();
    return out;
  }

 private:
  ThreadGroup& g_;
  int rank_;
};

// Runs fn on n ranks (threads); rethrows the first rank's exception.
inline void run_ranks(int n, const std::function<void(Coordinator&)>& fn) {
  ThreadGroup group(n);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      ThreadCoordinator coord(group, r);
      try {
        fn(coord);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

struct ModelTensor {
  std::string name;
  std::vector<int64_t> shape;
  int split_dim;  // the dimension tensor parallelism splits; -1: replicated
};

// `scale` multiplies the first dimension of the big matrices (checkpoint size).
inline std::vector<ModelTensor> test_model(int64_t scale = 1) {
  std::vector<ModelTensor> base = {{"emb", {32 * scale, 16}, 0}, {"blocks.0.w1", {16, 24}, 1},
                                   {"blocks.0.b1", {24}, 0},     {"blocks.0.w2", {24, 16}, 0},
                                   {"ln.weight", {16}, -1},      {"scale", {}, -1}};
  std::vector<ModelTensor> out;
  for (const char* kind : {"param/", "adam_m/", "adam_v/"})
    for (const auto& t : base) out.push_back({kind + t.name, t.shape, t.split_dim});
  return out;
}

// The value of element `flat` of tensor `name` at training step `step`.
inline float value_at(const std::string& name, int64_t flat, int64_t step) {
  return static_cast<float>(xxh3_64(name.data(), name.size()) % 1000) * 0.001f +
         static_cast<float>(flat) * 0.5f + static_cast<float>(step) * 1000.0f;
}

// The piece a rank holds under tensor parallelism `tp` and data parallelism `dp` (TP fastest): params
// split along split_dim over TP and replicated over DP; optimizer states further cut by flat ranges over
// DP (ZeRO-1).
inline Slice piece_for(const ModelTensor& t, int tp, int dp, int rank) {
  const int tp_rank = rank % tp, dp_rank = rank / tp;
  Slice s;
  s.name = t.name;
  s.shape = t.shape;
  s.offset.assign(t.shape.size(), 0);
  s.count = t.shape;
  if (t.split_dim >= 0) {
    s.count[t.split_dim] = t.shape[t.split_dim] / tp;
    s.offset[t.split_dim] = tp_rank * s.count[t.split_dim];
  }
  if (t.name.rfind("param/", 0) != 0) {
    int64_t n = 1;
    for (auto c : s.count) n *= c;
    s.begin = n * dp_rank / dp;
    s.end = n * (dp_rank + 1) / dp;
  }
  return s.normalized();
}

// Buffers holding a rank's pieces with the contents of `step`.
struct RankState {
  std::vector<Slice> slices;
  std::vector<std::vector<float>> data;

  std::vector<TensorData> tensors() const {
    std::vector<TensorData> out;
    for (size_t i = 0; i < slices.size(); ++i) out.push_back(TensorData{slices[i], data[i].data()});
    return out;
  }
};

inline std::vector<float> expected_data(const Slice& s, int64_t step) {
  std::vector<float> v(static_cast<size_t>(s.elements()));
  for (const Run& r : runs_of(s))
    for (int64_t i = r.lo; i < r.hi; ++i) v[r.at + (i - r.lo)] = value_at(s.name, i, step);
  return v;
}

inline RankState rank_state(int tp, int dp, int rank, int64_t step, int64_t scale = 1) {
  RankState st;
  for (const auto& t : test_model(scale)) {
    st.slices.push_back(piece_for(t, tp, dp, rank));
    st.data.push_back(expected_data(st.slices.back(), step));
  }
  return st;
}

inline CheckpointMeta meta_for(int64_t step, int tp = 1, int dp = 1) {
  CheckpointMeta m;
  m.step = step;
  m.tokens = step * 4096;
  m.loss = 10.0 / static_cast<double>(step + 1);
  m.spec_hash = "spec-abc";
  m.dataset_version = "ds-1";
  m.layout = Layout{.tp = tp, .dp = dp};
  m.model_config = Json{{"layers", 1}, {"d_model", 16}, {"vocab", 32}};
  m.data_cursor = Json{{"shard", 0}, {"offset", step * 8}};
  m.rng = Json{{"seed", 7}, {"counter", step}};
  m.verification = Json{{"batch_offset", step * 8}};
  m.verification_bytes = "batch-bytes-" + std::to_string(step);
  return m;
}

}  // namespace forge::ckpt::test
