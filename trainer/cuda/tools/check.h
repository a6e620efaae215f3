// forge-cuda-check's parts: the op comparisons (check_ops.cpp), the training runs and the throughput table
// (check_train.cpp), and the table printing they share.
#pragma once

#include <chrono>
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
  // The Llama-family row: Llama-3-8B's blocks, `llama_layers` of its 32 (check_train.cpp has the memory
  // arithmetic: 8 layers, seq 4096, batch 2 take about 82 GiB of an H200's 140).
  bool llama = true;
  int llama_layers = 8;
  int llama_seq = 4096;
  int llama_batch = 2;
  int llama_steps = 12;
  // Seconds after `started` by which the runs that can be cut short (the Llama row) have stopped: it is
  // skipped when too little is left to start it and stops stepping before the deadline; 0: none. So that
  // a watchdog's kill (scripts/gpu/check.sh) never takes the table with it.
  int deadline = 0;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  bool profile = false;  // only: four GPT-2-124M BF16 steps, the fourth inside cudaProfilerStart/Stop
};

// Trains the small config on CPU and GPU, the GPT-2-124M-class config and the Llama-family config on GPU;
// prints the loss comparison and, last, the throughput table. Returns false if a loss comparison failed.
bool check_train(const TrainOptions& options);
// options.profile: a run for a profiler started with profiling off (ncu --profile-from-start off).
void profile_train(const TrainOptions& options);

}  // namespace forge::trainer::cuda::check
