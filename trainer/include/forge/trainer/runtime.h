// Process-wide CPU runtime settings of the trainer: thread counts and the measured matrix-product peak.
#pragma once

namespace forge::trainer {

// The kernels' thread count: one OpenMP team of `threads` runs everything; matrix products are split
// into panels across it, one single-threaded OpenBLAS call per thread, so OpenBLAS's own worker threads
// never spin against OpenMP's on the same cores.
void use_threads(int threads);

// Measured OpenBLAS sgemm throughput in GFLOP/s for square n x n products on the current threads (best
// of `reps` after a warm-up): the peak MFU is reported against.
double measure_sgemm_gflops(int n = 2048, int reps = 3);

}  // namespace forge::trainer
