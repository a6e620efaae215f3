# Hybrid-parallel benchmark (bench/parallel.sh runs it on several layouts with mpirun).
if(TARGET forge_parallel)
  add_executable(bench_parallel ${CMAKE_CURRENT_LIST_DIR}/parallel.cpp)
  target_link_libraries(bench_parallel PRIVATE forge_parallel)
endif()
