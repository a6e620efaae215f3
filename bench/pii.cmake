# PII and safety stages of prepare: Hyperscan throughput on one core against a std::regex loop over the
# same patterns (bench/pii.sh).
if(TARGET forge_data)
  add_executable(bench_pii ${CMAKE_CURRENT_LIST_DIR}/pii.cpp)
  target_link_libraries(bench_pii PRIVATE forge_data)
  target_compile_definitions(bench_pii PRIVATE FORGE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
endif()
