# The compiler cache (Debian's ccache, scripts/install-deps.sh) in front of every compiler, for every preset.
# CI builds a fresh clone in another directory right after a session built the same sources on the same
# machine; for it to hit what that build left, paths must not enter the hash: base_dir turns the absolute
# source and include paths under this checkout into relative ones, and hash_dir off keeps the build
# directory out of the hash of objects with debug information (the sanitizer preset's -g1; their line
# tables then name the directory of whichever checkout compiled them first). Depend mode takes the headers
# a source includes from the compiler's own -MD file instead of running the preprocessor a second time on a
# miss. A compile definition holding
# an absolute path defeats both, which is why the tests find their files through the environment
# (test/support/paths.h). -DFORGE_CCACHE=OFF, or CCACHE_DISABLE=1 at build time, turns it off.
option(FORGE_CCACHE "Compile through ccache when it is installed" ON)
find_program(FORGE_CCACHE_PROGRAM ccache)
if(FORGE_CCACHE AND FORGE_CCACHE_PROGRAM AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(launcher env CCACHE_BASEDIR=${CMAKE_SOURCE_DIR} CCACHE_NOHASHDIR=true CCACHE_DEPEND=true
    ${FORGE_CCACHE_PROGRAM})
  foreach(lang C CXX CUDA)
    set(CMAKE_${lang}_COMPILER_LAUNCHER ${launcher})
  endforeach()
endif()
