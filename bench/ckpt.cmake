# Checkpoint benchmark (docs/PERFORMANCE.md "ckpt"): save stall vs synchronous write, write throughput vs
# dd conv=fsync, load vs a raw read, and the per-rank-file format vs one serial HDF5 file.
if(TARGET forge_ckpt)
  add_executable(bench_ckpt ${CMAKE_CURRENT_LIST_DIR}/ckpt_bench.cpp)
  target_link_libraries(bench_ckpt PRIVATE forge_ckpt HDF5::HDF5)
endif()
