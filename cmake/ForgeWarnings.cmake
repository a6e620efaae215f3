# Warning and sanitizer flags applied to every target of this project (not to dependencies).
add_compile_options(-Wall -Wextra)
if(FORGE_WERROR)
  add_compile_options(-Werror)
endif()
if(FORGE_SANITIZE)
  # GCC 12's -Wmaybe-uninitialized misfires on sanitizer-instrumented code (e.g. inside Catch2).
  add_compile_options(-Wno-maybe-uninitialized)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
