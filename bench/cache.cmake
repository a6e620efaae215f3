# The node-local shard cache: a reader's open from the cache against the shared copy (bench/cache.sh).
if(TARGET forge_data)
  add_executable(bench_cache ${CMAKE_CURRENT_LIST_DIR}/cache_bench.cpp)
  target_link_libraries(bench_cache PRIVATE forge_data)
endif()
