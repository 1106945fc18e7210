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
  stillpoint_pch_launcher(${target})
endfunction()

# stillpoint_reuse_precompiled_headers(<target> <donor>)
#
# Compiles the target's sources against the precompiled header of <donor>
# (made by stillpoint_precompile_headers), built once for both. The two
# targets must compile with the same flags and definitions, or GCC ignores
# the header and parses everything again.
function(stillpoint_reuse_precompiled_headers target donor)
  target_precompile_headers(${target} REUSE_FROM ${donor})
  # Say so, rather than compile slowly, when GCC finds the header unusable.
  target_compile_options(${target} PRIVATE $<$<CXX_COMPILER_ID:GNU>:-Winvalid-pch>)
  stillpoint_pch_launcher(${target})
endfunction()

function(stillpoint_pch_launcher target)
  if(CMAKE_CXX_COMPILER_LAUNCHER MATCHES "ccache")
    set_property(TARGET ${target} PROPERTY CXX_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env
      CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      ${CMAKE_CXX_COMPILER_LAUNCHER})
  endif()
endfunction()
