# FORGE_CUDA=AUTO turns the CUDA/NCCL backend on only when the toolkit and NCCL are both present;
# nothing GPU-related is needed to build or test the CPU path.
set(FORGE_WITH_CUDA OFF)
if(NOT FORGE_CUDA STREQUAL "OFF")
  set(_cuda_root /usr/local/cuda)
  if(EXISTS ${_cuda_root}/bin/nvcc AND (EXISTS ${_cuda_root}/include/nccl.h OR EXISTS /usr/include/nccl.h))
    set(FORGE_WITH_CUDA ON)
  elseif(FORGE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FORGE_CUDA=ON but no nvcc and nccl.h under ${_cuda_root}")
  endif()
endif()
message(STATUS "SlurmForge CUDA backend: ${FORGE_WITH_CUDA}")
