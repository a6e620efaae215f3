# Vision-language training step and its vision tower (bench/vision.sh runs it with the PyTorch peer).
if(TARGET forge_trainer)
  add_executable(bench_vision ${CMAKE_CURRENT_LIST_DIR}/vision.cpp)
  target_link_libraries(bench_vision PRIVATE forge_trainer)
endif()
