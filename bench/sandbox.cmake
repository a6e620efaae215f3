# The code sandbox's start from a process that holds much memory, as a trainer or a gate does
# (bench/sandbox.sh).
if(TARGET forge_gate)
  add_executable(bench_sandbox ${CMAKE_CURRENT_LIST_DIR}/sandbox.cpp)
  target_link_libraries(bench_sandbox PRIVATE forge_gate)
  target_include_directories(bench_sandbox PRIVATE ${PROJECT_SOURCE_DIR}/eval_gate/src)
endif()
