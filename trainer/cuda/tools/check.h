// forge-cuda-check's parts: the op comparisons (check_ops.cpp), the training runs and the throughput table
// (check_train.cpp), and the table printing they share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace forge::trainer::cuda::check {

// One compared quantity: max |gpu - cpu| / max |cpu| over all elements (NaN or Inf anywhere never passes).
struct Row {
  std::string what, dtype;
  double err = 0, tol = 0;
  bool pass = false;
};

class Table {
 public:
  void add(const std::string& what, const std::string& dtype, double err, double tol);
  void print(const char* title) const;
  bool all_pass() const;

 private:
  std::vector<Row> rows_;
};

// Every CUDA op forward and backward against its CPU op, FP32 and BF16, plus the single-rank NCCL
// communicator. Returns false if any comparison failed.
bool check_ops(uint64_t seed);

// Every Backend op of make_cuda_backend(device) against cpu_backend() (check_backend.cpp); false if any
// comparison failed.
bool check_backend(uint64_t seed, int device);

struct TrainOptions {
  std::string config;   // the small config (configs/bench-cpu.ini)
  int steps = 30;       // GPU steps per run
  int cpu_steps = 6;    // CPU FP32 steps compared
  int gpt2_batch = 16;  // GPT-2-124M-class micro-batch
  bool gpt2 = true;
  bool profile = false;  // only: four GPT-2-124M BF16 steps, the fourth inside cudaProfilerStart/Stop
};

// Trains the small config on CPU and GPU and the GPT-2-124M-class config on GPU; prints the loss comparison
// and, last, the throughput table. Returns false if a loss comparison failed.
bool check_train(const TrainOptions& options);
// options.profile: a run for a profiler started with profiling off (ncu --profile-from-start off).
void profile_train(const TrainOptions& options);

}  // namespace forge::trainer::cuda::check
