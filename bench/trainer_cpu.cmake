# Trainer CPU benchmark (bench/trainer_cpu.sh runs it together with the PyTorch peer).
if(TARGET forge_trainer)
  add_executable(bench_trainer_cpu ${CMAKE_CURRENT_LIST_DIR}/trainer_cpu.cpp)
  target_include_directories(bench_trainer_cpu PRIVATE ${PROJECT_SOURCE_DIR}/trainer/src)
  target_link_libraries(bench_trainer_cpu PRIVATE forge_parallel)
endif()
