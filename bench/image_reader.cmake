# The reader's picture samples per CPU-second against one H200's appetite at a 7B vision-language model
# (bench/image_reader.sh).
if(TARGET forge_data AND TARGET forge_trainer)
  add_executable(bench_image_reader ${CMAKE_CURRENT_LIST_DIR}/image_reader.cpp)
  target_link_libraries(bench_image_reader PRIVATE forge_data forge_trainer)
endif()
