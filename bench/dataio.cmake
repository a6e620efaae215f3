# dataio benchmarks: the reader against a raw read of the same bytes (bench_data_reader), and
# `forge-data prepare` on the demo corpus (bench/data_prepare.sh).
if(TARGET forge_data)
  add_executable(bench_data_reader ${CMAKE_CURRENT_LIST_DIR}/data_reader.cpp)
  target_link_libraries(bench_data_reader PRIVATE forge_data)
endif()
