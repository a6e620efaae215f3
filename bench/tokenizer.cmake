# Tokenizer encode throughput on one core, Hugging Face tokenizer.json next to the Python reference
# (bench/tokenizer.sh).
if(TARGET forge_data)
  add_executable(bench_tokenizer ${CMAKE_CURRENT_LIST_DIR}/tokenizer_bench.cpp)
  target_link_libraries(bench_tokenizer PRIVATE forge_data)
endif()
