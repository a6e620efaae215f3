// A backend whose memory the host cannot read: the CPU backend's ops on the CPU backend's memory, handed
// out at addresses moved far beyond user space (non-canonical on x86-64), so any host code that reads or
// writes a buffer directly instead of through copy_to_host / copy_from_host crashes at once. It stands in
// for a GPU in tests of everything around the ops (the runtime, staged communicators, checkpoint staging):
// the same arithmetic as the CPU backend, so a run on it must match a CPU run bit for bit.
//
// Like a GPU, which unmaps what release hands back, it makes the whole pages of a released range
// inaccessible until acquire: a read or write of released memory (weights or gradients ZeRO-2/3 let go
// of) crashes the test instead of reading zeros as the CPU backend allows.
//
// Like the CUDA backend, it keeps its own copy of each BF16 working copy of weights it is told of
// (bf16_working_copy) and its matrix products read `w` from that copy: a working copy changed without the
// model saying so leaves the copy stale and the run off the CPU's.
#pragma once

#include "forge/trainer/backend.h"

#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

namespace forge::test {

class FarBackend final : public trainer::Backend {
 public:
  static constexpr uintptr_t kOffset = uintptr_t{1} << 60;

  std::string name() const override { return "far"; }
  bool host_memory() const override { return false; }
  bool device_memory(const void* p) const override { return reinterpret_cast<uintptr_t>(p) >= kOffset; }

  std::unique_ptr<trainer::Allocation> allocate(size_t bytes) override {
    ++allocations_;
    return std::make_unique<Far>(cpu_.allocate(bytes), bytes, *this);
  }
  std::unique_ptr<trainer::Allocation> allocate_host(size_t bytes) override {
    ++allocations_;
    return Backend::allocate_host(bytes);
  }
  // Allocations so far, far and host (what a GPU backend pays for most: cudaMalloc, cudaHostAlloc).
  int64_t allocations() const { return allocations_; }
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override {
    ++host_copies_;
    if (bytes > 0) std::memcpy(near(dst), host(host_src), bytes);
  }
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override {
    ++host_copies_;
    if (bytes > 0) std::memcpy(host(host_dst), near(src), bytes);
  }
  // Copies between host and far memory so far.
  int64_t host_copies() const { return host_copies_; }
  void copy(void* dst, const void* src, size_t bytes) override { cpu_.copy(near(dst), near(src), bytes); }
  void fill(float* x, float value, size_t n) override { cpu_.fill(near(x), value, n); }
  void release(float* x, size_t n) override {
    float* lo = near(x);
    const Pages whole = inside(lo, n);
    if (whole.bytes == 0) return cpu_.fill(lo, 0.0f, n);
    std::memset(lo, 0, size_t(whole.at - reinterpret_cast<char*>(lo)));
    std::memset(whole.at + whole.bytes, 0,
                size_t(reinterpret_cast<char*>(lo + n) - (whole.at + whole.bytes)));
    protect(whole, PROT_NONE);
    if (madvise(whole.at, whole.bytes, MADV_DONTNEED) != 0) throw std::runtime_error("FarBackend: madvise");
  }
  void acquire(float* x, size_t n) override {
    if (n == 0) return;
    // Every page the range touches: a released one comes back readable, zeroed (MADV_DONTNEED).
    const uintptr_t page = page_bytes(), lo = reinterpret_cast<uintptr_t>(near(x)) / page * page;
    const uintptr_t hi = (reinterpret_cast<uintptr_t>(near(x + n)) + page - 1) / page * page;
    protect({reinterpret_cast<char*>(lo), hi - lo}, PROT_READ | PROT_WRITE);
  }

  void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions, const float* wte,
                         const float* wpe, int B, int T, int C, int vb, int ve) override {
    cpu_.embedding_forward(near(out), near(tokens), near(positions), near(wte), near(wpe), B, T, C, vb, ve);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          const int32_t* positions, int B, int T, int C, int vb, int ve) override {
    cpu_.embedding_backward(near(dwte), near(dwpe), near(dout), near(tokens), near(positions), B, T, C, vb,
                            ve);
  }
  void layernorm_forward(trainer::Act out, float* mean, float* rstd, const float* in, const float* weight,
                         const float* bias, float eps, int N, int C) override {
    cpu_.layernorm_forward(near(out), near(mean), near(rstd), near(in), near(weight), near(bias), eps, N, C);
  }
  void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                          const float* weight, const float* mean, const float* rstd, int N, int C) override {
    cpu_.layernorm_backward(near(din), near(dweight), near(dbias), near(dout), near(in), near(weight),
                            near(mean), near(rstd), N, C);
  }
  void residual_layernorm_forward(float* res_out, trainer::Act ln_out, float* mean, float* rstd,
                                  const float* res_in, const float* delta, const float* delta_bias,
                                  const float* weight, const float* bias, float eps, int N, int C) override {
    cpu_.residual_layernorm_forward(near(res_out), near(ln_out), near(mean), near(rstd), near(res_in),
                                    near(delta), near(delta_bias), near(weight), near(bias), eps, N, C);
  }
  void residual_forward(float* res_out, const float* res_in, const float* delta, const float* delta_bias,
                        int N, int C) override {
    cpu_.residual_forward(near(res_out), near(res_in), near(delta), near(delta_bias), N, C);
  }
  void bf16_working_copy(const float* values, size_t n) override {
    if (n == 0) return;
    const float* host = near(values);
    if (float* part = kept(values, n)) {  // a part of a kept copy
      std::copy(host, host + n, part);
      return;
    }
    // A new working copy, which may reuse the memory of one that is gone: drop every copy it overlaps.
    auto it = copies_.lower_bound(values);
    if (it != copies_.begin() && std::prev(it)->first + std::prev(it)->second.size() > values) --it;
    while (it != copies_.end() && it->first < values + n) it = copies_.erase(it);
    copies_.emplace(values, std::vector<float>(host, host + n));
  }
  void matmul_forward(trainer::Act out, trainer::ConstAct in, const float* w, const float* bias, int N, int C,
                      int OC) override {
    cpu_.matmul_forward(near(out), near(in), weights(w), near(bias), N, C, OC);
  }
  void matmul_bias_gelu_forward(trainer::Act out, trainer::Act pre, trainer::ConstAct in, const float* w,
                                const float* bias, int N, int C, int OC) override {
    cpu_.matmul_bias_gelu_forward(near(out), near(pre), near(in), weights(w), near(bias), N, C, OC);
  }
  void matmul_backward(float* din, float* dw, float* dbias, const float* dout, trainer::ConstAct in,
                       const float* w, int N, int C, int OC) override {
    cpu_.matmul_backward(near(din), near(dw), near(dbias), near(dout), near(in), weights(w), N, C, OC);
  }
  void add_bias(float* out, const float* bias, int N, int OC) override {
    cpu_.add_bias(near(out), near(bias), N, OC);
  }
  void attention_forward(trainer::Act out, float* lse, trainer::ConstAct qkv, const int32_t* doc_start, int B,
                         int T, const trainer::AttentionShape& shape) override {
    cpu_.attention_forward(near(out), near(lse), near(qkv), near(doc_start), B, T, shape);
  }
  void attention_backward(float* dqkv, const float* dout, trainer::ConstAct qkv, trainer::ConstAct out,
                          const float* lse, const int32_t* doc_start, int B, int T,
                          const trainer::AttentionShape& shape) override {
    cpu_.attention_backward(near(dqkv), near(dout), near(qkv), near(out), near(lse), near(doc_start), B, T,
                            shape);
  }
  void rmsnorm_backward_partials(float* din, float* partial, const float* dout, const float* in,
                                 const float* weight, const float* rstd, int N, int C) override {
    cpu_.rmsnorm_backward_partials(near(din), near(partial), near(dout), near(in), near(weight), near(rstd),
                                   N, C);
  }
  void layernorm_backward_partials(float* din, float* partial, const float* dout, const float* in,
                                   const float* weight, const float* mean, const float* rstd, int N,
                                   int C) override {
    cpu_.layernorm_backward_partials(near(din), near(partial), near(dout), near(in), near(weight), near(mean),
                                     near(rstd), N, C);
  }
  void add_chunk_sums(float* grad, const float* partial, int64_t chunks, int width, int stride) override {
    cpu_.add_chunk_sums(near(grad), near(partial), chunks, width, stride);
  }
  void attention_chunk_forward(const trainer::AttentionChunks& c, trainer::ChunkRows out,
                               float* lse) override {
    cpu_.attention_chunk_forward(near(c), near(out), near(lse));
  }
  void attention_chunk_backward(const trainer::AttentionChunks& c, trainer::ChunkRows dout, const float* lse,
                                const float* delta, trainer::ChunkRows dq, trainer::ChunkRows dk,
                                trainer::ChunkRows dv) override {
    cpu_.attention_chunk_backward(near(c), near(dout), near(lse), near(delta), near(dq), near(dk), near(dv));
  }
  void attention_delta(float* delta, const float* out, const float* dout, int B, int T,
                       const trainer::AttentionShape& shape) override {
    cpu_.attention_delta(near(delta), near(out), near(dout), B, T, shape);
  }
  void copy_rows(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int width,
                 int64_t rows) override {
    cpu_.copy_rows(near(dst), dst_ld, near(src), src_ld, width, rows);
  }
  void convert(trainer::Act out, trainer::ConstAct in, size_t n) override {
    cpu_.convert(near(out), near(in), n);
  }
  void attention_decode(trainer::Act out, trainer::ConstAct qkv, float* k_cache, float* v_cache,
                        const int32_t* seq, const int32_t* pos, int rows, int max_len,
                        const trainer::AttentionShape& shape) override {
    cpu_.attention_decode(near(out), near(qkv), near(k_cache), near(v_cache), near(seq), near(pos), rows,
                          max_len, shape);
  }
  void rope(trainer::Act qkv, const int32_t* positions, const float* inv_freq, float magnitude, int N, int T,
            const trainer::AttentionShape& shape, bool inverse) override {
    cpu_.rope(near(qkv), near(positions), near(inv_freq), magnitude, N, T, shape, inverse);
  }
  void head_rmsnorm_forward(trainer::Act qkv, float* saved, float* rstd, const float* q_weight,
                            const float* k_weight, float eps, int N,
                            const trainer::AttentionShape& shape) override {
    cpu_.head_rmsnorm_forward(near(qkv), near(saved), near(rstd), near(q_weight), near(k_weight), eps, N,
                              shape);
  }
  void head_rmsnorm_backward(float* dqkv, float* dq_weight, float* dk_weight, const float* saved,
                             const float* rstd, const float* q_weight, const float* k_weight, int N,
                             const trainer::AttentionShape& shape) override {
    cpu_.head_rmsnorm_backward(near(dqkv), near(dq_weight), near(dk_weight), near(saved), near(rstd),
                               near(q_weight), near(k_weight), N, shape);
  }
  void swiglu_forward(trainer::Act out, trainer::ConstAct in, int N, int H) override {
    cpu_.swiglu_forward(near(out), near(in), N, H);
  }
  void swiglu_backward(float* din, const float* dout, trainer::ConstAct in, int N, int H) override {
    cpu_.swiglu_backward(near(din), near(dout), near(in), N, H);
  }
  void rmsnorm_forward(trainer::Act out, float* rstd, const float* in, const float* weight, float eps, int N,
                       int C) override {
    cpu_.rmsnorm_forward(near(out), near(rstd), near(in), near(weight), eps, N, C);
  }
  void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in, const float* weight,
                        const float* rstd, int N, int C) override {
    cpu_.rmsnorm_backward(near(din), near(dweight), near(dout), near(in), near(weight), near(rstd), N, C);
  }
  void residual_rmsnorm_forward(float* res_out, trainer::Act out, float* rstd, const float* res_in,
                                const float* delta, const float* delta_bias, const float* weight, float eps,
                                int N, int C) override {
    cpu_.residual_rmsnorm_forward(near(res_out), near(out), near(rstd), near(res_in), near(delta),
                                  near(delta_bias), near(weight), eps, N, C);
  }
  void gelu_backward(float* dinout, trainer::ConstAct pre, int N, int C) override {
    cpu_.gelu_backward(near(dinout), near(pre), N, C);
  }
  void gather_rows(float* out, trainer::ConstAct in, const int32_t* index, const float* scale, int rows,
                   int C) override {
    cpu_.gather_rows(near(out), near(in), near(index), near(scale), rows, C);
  }
  void combine_rows(float* out, const float* in, const int32_t* index, const float* weight, int N, int k,
                    int C, bool accumulate) override {
    cpu_.combine_rows(near(out), near(in), near(index), near(weight), N, k, C, accumulate);
  }
  void row_dots(float* dot, const float* a, const float* b, const int32_t* index, int N, int k,
                int C) override {
    cpu_.row_dots(near(dot), near(a), near(b), near(index), N, k, C);
  }
  double cross_entropy(float* logits, const int32_t* targets, const float* weights, int rows, int V,
                       int vocab_begin, float scale, bool backward, trainer::VocabGroup* group,
                       float* nll) override {
    return cpu_.cross_entropy(near(logits), near(targets), near(weights), rows, V, vocab_begin, scale,
                              backward, group, near(nll));
  }
  double distillation(float* logits, float* teacher, const int32_t* targets, const float* weights, int rows,
                      int V, int vocab_begin, float temperature, float alpha, float scale, bool backward,
                      trainer::VocabGroup* group, double* kl_sum) override {
    return cpu_.distillation(near(logits), near(teacher), near(targets), near(weights), rows, V, vocab_begin,
                             temperature, alpha, scale, backward, group, kl_sum);
  }
  void round_to_bf16(float* out, const float* in, size_t n) override {
    cpu_.round_to_bf16(near(out), near(in), n);
  }
  double sum_squares(const float* x, std::span<const trainer::FlatRange> ranges) override {
    return cpu_.sum_squares(near(x), ranges);
  }
  void scale(float* x, float factor, std::span<const trainer::FlatRange> ranges) override {
    cpu_.scale(near(x), factor, ranges);
  }
  void adamw(float* weights, const float* grads, float* m, float* v,
             std::span<const trainer::AdamWSegment> segments, const trainer::AdamWStep& step) override {
    cpu_.adamw(near(weights), near(grads), near(m), near(v), segments, step);
  }

  // The address the host can use for a far one (null stays null); a host address is a test's bug.
  template <typename T>
  static T* near(T* p) {
    if (p == nullptr) return nullptr;
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if (a < kOffset) throw std::logic_error("FarBackend: an op was given host memory");
    return reinterpret_cast<T*>(a - kOffset);
  }
  static trainer::Act near(trainer::Act a) {
    a.data = near(a.data);
    return a;
  }
  static trainer::ConstAct near(trainer::ConstAct a) {
    a.data = near(a.data);
    return a;
  }
  static trainer::ChunkRows near(trainer::ChunkRows r) {
    r.base = near(r.base);
    return r;
  }
  static trainer::AttentionChunks near(trainer::AttentionChunks c) {
    c.q = near(c.q);
    c.k = near(c.k);
    c.v = near(c.v);
    c.q_seg = near(c.q_seg);
    c.k_seg = near(c.k_seg);
    return c;
  }

 private:
  // Freed: the copies kept of what it held are forgotten, as the CUDA backend forgets them.
  class Far final : public trainer::Allocation {
   public:
    Far(std::unique_ptr<trainer::Allocation> memory, size_t bytes, FarBackend& owner)
        : memory_(std::move(memory)), bytes_(bytes), owner_(owner) {}
    ~Far() override {
      // The allocator may write into what it frees: what a release left inaccessible is made usable.
      if (void* p = memory_->data())
        protect(inside(static_cast<float*>(p), bytes_ / 4), PROT_READ | PROT_WRITE);
      const auto* lo = static_cast<const float*>(data());
      for (auto it = owner_.copies_.lower_bound(lo);
           it != owner_.copies_.end() && it->first < lo + bytes_ / 4;)
        it = owner_.copies_.erase(it);
    }
    void* data() override {
      void* p = memory_->data();
      return p == nullptr ? nullptr : reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) + kOffset);
    }

   private:
    std::unique_ptr<trainer::Allocation> memory_;
    size_t bytes_;
    FarBackend& owner_;
  };
  // The whole pages inside [x, x + n) (host addresses).
  struct Pages {
    char* at;
    size_t bytes;
  };
  static size_t page_bytes() { return size_t(sysconf(_SC_PAGESIZE)); }
  static Pages inside(float* x, size_t n) {
    const uintptr_t page = page_bytes(), lo = reinterpret_cast<uintptr_t>(x), hi = lo + n * sizeof(float);
    const uintptr_t first = (lo + page - 1) / page * page, last = hi / page * page;
    return first < last ? Pages{reinterpret_cast<char*>(first), last - first} : Pages{nullptr, 0};
  }
  static void protect(Pages p, int how) {
    if (p.bytes > 0 && mprotect(p.at, p.bytes, how) != 0) throw std::runtime_error("FarBackend: mprotect");
  }
  template <typename T>
  static T* host(T* p) {
    if (reinterpret_cast<uintptr_t>(p) >= kOffset)
      throw std::logic_error("FarBackend: a host copy was given far memory");
    return p;
  }

  // Where the kept copies hold [values, values + n): null when none holds all of them.
  float* kept(const float* values, size_t n) {
    auto it = copies_.upper_bound(values);
    if (it == copies_.begin()) return nullptr;
    --it;
    const size_t at = size_t(values - it->first);
    return at + n <= it->second.size() ? it->second.data() + at : nullptr;
  }
  // Where a product reads `w` ([out, in] of a Linear: at least one element) from: a kept copy, if any.
  const float* weights(const float* w) {
    const float* part = kept(w, 1);
    return part != nullptr ? part : near(w);
  }

  trainer::Backend& cpu_ = trainer::cpu_backend();
  std::map<const float*, std::vector<float>> copies_;  // bf16_working_copy, by the working copy's start
  int64_t host_copies_ = 0, allocations_ = 0;
};

}  // namespace forge::test
