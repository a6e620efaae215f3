# Near dedup on a planted corpus: recall and false positives by exact Jaccard, signature throughput
# (bench/near_dedup.sh).
if(TARGET forge_data)
  add_executable(bench_near_dedup ${CMAKE_CURRENT_LIST_DIR}/near_dedup.cpp)
  target_link_libraries(bench_near_dedup PRIVATE forge_data)
  target_include_directories(bench_near_dedup PRIVATE ${PROJECT_SOURCE_DIR}/test)
endif()
