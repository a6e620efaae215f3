# `format` rewrites the sources in place; `format-check` (also a ctest test, label lint) fails on drift.
find_program(CLANG_FORMAT clang-format)
if(CLANG_FORMAT)
  add_custom_target(format
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/scripts/format.sh --fix
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  add_custom_target(format-check
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/scripts/format.sh
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  add_test(NAME lint.clang_format COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/scripts/format.sh
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(lint.clang_format PROPERTIES LABELS lint)
endif()
