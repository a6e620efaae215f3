// A communicator for buffers in the other kind of memory. The runtime hands its communicators whatever
// the model's backend holds (gradients, activations: device memory on a GPU backend) and a few host
// values (the step's loss sums, checksums, host names). NCCL moves device memory only, MPI host memory
// only (a host-staged MPI, not a CUDA-aware one: parallel.comm = mpi on GPUs, and the way several ranks
// share one GPU, which NCCL refuses). staged_comm bridges both: it copies each buffer of the other kind
// into memory of the kind the inner communicator takes before the call and back after it completes; that
// staging memory is kept for later calls (allocating it per call would synchronise a GPU).
#pragma once

#include "forge/comm/comm.h"
#include "forge/trainer/backend.h"

#include <memory>

namespace forge::trainer {

// The memory an implementation of Comm moves.
enum class CommMemory { kHost, kDevice };

// `inner` (which moves `takes` memory), for buffers of `backend` (device memory when
// backend.device_memory says so) and of the host. A buffer already of the kind `inner` takes passes
// through untouched, so over a host backend with an MPI communicator nothing is ever copied. Outputs
// reach the caller's buffer when the request's wait() (or a test() that returns true) returns.
// Communicators split from the result are staged alike; stats() are the inner communicator's.
std::unique_ptr<comm::Comm> staged_comm(std::unique_ptr<comm::Comm> inner, Backend& backend,
                                        CommMemory takes);

}  // namespace forge::trainer
