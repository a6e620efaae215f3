// Sums over OpenMP threads that come out the same on every run. An OpenMP reduction adds the threads'
// partial sums in the order the threads finish, so with three threads or more (or a running total
// carried in) its last bits vary from run to run; here each thread sums the contiguous block that
// schedule(static) gives it and the partials are added in thread order.
#pragma once

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace forge::trainer::cpu {

// K sums over i in [0, n): block(lo, hi, acc) adds the terms of [lo, hi) into acc (K doubles, zeroed).
template <int K, class Block>
std::array<double, K> ordered_sum(int64_t n, Block&& block) {
  std::vector<std::array<double, K>> partial(size_t(omp_get_max_threads()), std::array<double, K>{});
#pragma omp parallel
  {
    // libgomp's schedule(static) split: the first n % threads threads get one more.
    const int64_t threads = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t q = n / threads, r = n % threads;
    const int64_t lo = id * q + std::min(id, r), hi = lo + q + (id < r ? 1 : 0);
    if (hi > lo) block(lo, hi, partial[size_t(id)]);
  }
  std::array<double, K> total{};
  for (const auto& p : partial)
    for (int k = 0; k < K; ++k) total[size_t(k)] += p[size_t(k)];
  return total;
}

}  // namespace forge::trainer::cpu
