#include "forge/trainer/runtime.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace forge::trainer {

void use_threads(int threads) {
  omp_set_num_threads(threads);
  openblas_set_num_threads(1);  // products are split across OpenMP threads (cpu::sgemm)
}

double measure_sgemm_gflops(int n, int reps) {
  // The peak is OpenBLAS's own threading over all of our threads, whatever the kernels use.
  const int saved = openblas_get_num_threads();
  openblas_set_num_threads(omp_get_max_threads());
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, s);  // r == 0 warms up caches and the thread pool
  }
  openblas_set_num_threads(saved);
  return 2.0 * double(n) * n * n / best / 1e9;
}

}  // namespace forge::trainer
