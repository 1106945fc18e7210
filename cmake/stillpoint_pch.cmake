# stillpoint_precompile_headers(<target> <header>...)
#
# Compiles the target's sources against one precompiled header of the given
# headers (target_precompile_headers: <angle> or [["quoted"]] include names),
# so a heavy third-party header (GoogleTest, Eigen, pybind11) is parsed once
# per target rather than once per source. ccache caches compiles that use a
# precompiled header only when it may ignore the macros and time stamps it
# cannot see through it; the target's launcher says so when it is ccache.
function(stillpoint_precompile_headers target)
  target_precompile_headers(${target} PRIVATE ${ARGN})
  if(CMAKE_CXX_COMPILER_LAUNCHER MATCHES "ccache")
    set_property(TARGET ${target} PROPERTY CXX_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env
      CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      ${CMAKE_CXX_COMPILER_LAUNCHER})
  endif()
endfunction()
