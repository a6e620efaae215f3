# Images of image-text datasets: decode_image, fit_image and perceptual_hash on one core against the
# libraries' own decode (bench/image_decode.sh); the bench calls libpng and libjpeg-turbo directly too.
if(TARGET forge_data)
  pkg_check_modules(BENCH_LIBPNG IMPORTED_TARGET libpng)
  pkg_check_modules(BENCH_LIBJPEG IMPORTED_TARGET libjpeg)
  add_executable(bench_image_decode ${CMAKE_CURRENT_LIST_DIR}/image_decode.cpp)
  target_link_libraries(bench_image_decode PRIVATE forge_data PkgConfig::BENCH_LIBPNG PkgConfig::BENCH_LIBJPEG)
endif()
