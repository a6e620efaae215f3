// The NCCL implementation of forge::comm::Comm (comm.h) for GPU ranks. Buffers are device memory.
//
// Ordering: each communicator has its own CUDA stream; an operation first waits (on the device) for the
// work already queued on the compute stream, so it reads what the kernels before it wrote. A Request is a
// CUDA event recorded after the operation: wait()/test() poll it and, while it is pending, poll
// ncclCommGetAsyncError, so a failed peer or network surfaces as an error instead of a hang.
//
// Errors: forge::Error(kComm, exit 69), one line naming the group, the rank, the device and the call.
// abort(): ncclCommAbort (never the blocking destroy) and the process ends with the given code, as
// MPI_Abort does; the watchdog calls it when an operation hangs.
#pragma once

#include "forge/comm/comm.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace forge::trainer::cuda {

// Copies `bytes` bytes from rank 0 of the new group to all its ranks (the caller's MPI broadcast over the
// same ranks); used once, for the ncclUniqueId.
using BootstrapBroadcast = std::function<void(void* data, size_t bytes)>;

// A communicator of `size` ranks on the current device (bind_device first). `compute`: the stream whose
// queued work an operation must follow (nullptr: the legacy default stream).
std::unique_ptr<comm::Comm> make_nccl_comm(int rank, int size, const std::string& name,
                                           const BootstrapBroadcast& bcast, cudaStream_t compute = nullptr);

}  // namespace forge::trainer::cuda
