// The CUDA backend of the seam (forge/trainer/backend.h), FP32: buffers in device memory, every op queued on
// the context's stream (context.h) with exactly the CPU backend's semantics (trainer/src/cpu/). It reuses
// the kernels of ops.h where their semantics match an op and adds the rest (src/backend_kernels.h): simple
// kernels written to be checked against the CPU ops (forge-cuda-check backend), not tuned.
#pragma once

#include "forge/trainer/backend.h"

#include <memory>

namespace forge::trainer::cuda {

// The backend on CUDA device `device` (made current; the process's one context, stream and cuBLASLt
// handle live on it). CUDA failures throw forge::Error (exit 69) naming the device, the rank and the call.
std::unique_ptr<Backend> make_cuda_backend(int device);

}  // namespace forge::trainer::cuda
