# Decoding benchmark: KV-cached generation against recomputing the prefix (bench/decode.sh runs it together
# with the PyTorch peer).
if(TARGET forge_gate)
  find_package(OpenMP REQUIRED COMPONENTS CXX)
  add_executable(bench_decode ${CMAKE_CURRENT_LIST_DIR}/decode.cpp)
  target_include_directories(bench_decode PRIVATE ${PROJECT_SOURCE_DIR}/trainer/src)
  target_link_libraries(bench_decode PRIVATE forge_gate OpenMP::OpenMP_CXX PkgConfig::OPENBLAS)
  # The profile's loops on the same vector units as the trainer's kernels.
  target_compile_options(bench_decode PRIVATE -O3 -march=${FORGE_CPU_ARCH})
endif()
