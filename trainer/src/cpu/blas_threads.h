// OpenBLAS single-threaded for a scope: kernels whose callers are OpenMP threads (attention.cpp,
// context_attention.cpp) call sgemm from each thread, and the two thread pools must not run at once.
#pragma once

#include <cblas.h>

namespace forge::trainer::cpu {

class BlasSingleThread {
 public:
  BlasSingleThread() : saved_(openblas_get_num_threads()) { openblas_set_num_threads(1); }
  ~BlasSingleThread() { openblas_set_num_threads(saved_); }
  BlasSingleThread(const BlasSingleThread&) = delete;
  BlasSingleThread& operator=(const BlasSingleThread&) = delete;

 private:
  int saved_;
};

}  // namespace forge::trainer::cpu
