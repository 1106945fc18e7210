# The include walls (docs/architecture.md).
#
# The sources spell every project include as "<folder>/x.h" ("framework/ops.h",
# "layers/linear.h"). No target gets the source tree as its include path:
# each gets a staged include root in the build tree, BUILD/include/<name>/,
# holding symbolic links to the headers it owns, under the same relative
# paths. A target sees its own root and, through its link dependencies, the
# roots of the folders below it, and nothing else, so an upward include
# ("layers/x.h" from framework) or an include of the kernels
# ("framework/kernels/gemm.h" outside framework) is "file not found".
# Headers are re-linked at every configure (a new header triggers one through
# CONFIGURE_DEPENDS); links to removed headers disappear with the old root.

# stillpoint_stage_headers(<name> <folder> [EXCLUDE <subfolder>...])
#
# Links every *.h below <folder> (a path relative to the source tree), except
# those below the EXCLUDE subfolders (relative to <folder>), into
# BUILD/include/<name>/<folder>/. Sets stillpoint_staged_root to the root and
# stillpoint_staged_headers to the headers' paths relative to <folder>.
function(stillpoint_stage_headers name folder)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "EXCLUDE")
  set(source ${PROJECT_SOURCE_DIR}/${folder})
  set(root ${PROJECT_BINARY_DIR}/include/${name})
  file(GLOB_RECURSE headers CONFIGURE_DEPENDS RELATIVE ${source} ${source}/*.h)
  foreach(excluded ${arg_EXCLUDE})
    list(FILTER headers EXCLUDE REGEX "^${excluded}/")
  endforeach()
  list(SORT headers)
  file(REMOVE_RECURSE ${root})
  foreach(header ${headers})
    get_filename_component(directory ${root}/${folder}/${header} DIRECTORY)
    file(MAKE_DIRECTORY ${directory})
    file(CREATE_LINK ${source}/${header} ${root}/${folder}/${header} SYMBOLIC)
  endforeach()
  set(stillpoint_staged_root ${root} PARENT_SCOPE)
  set(stillpoint_staged_headers ${headers} PARENT_SCOPE)
endfunction()

# stillpoint_install_headers(<folder> <headers>...)
#
# Installs the headers (paths relative to <folder>) as
# PREFIX/include/stillpoint/<folder>/..., where the exported targets'
# INSTALL_INTERFACE include directory (PREFIX/include/stillpoint) finds them.
function(stillpoint_install_headers folder)
  foreach(header ${ARGN})
    get_filename_component(subdirectory ${header} DIRECTORY)
    install(FILES ${PROJECT_SOURCE_DIR}/${folder}/${header}
      DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/stillpoint/${folder}/${subdirectory})
  endforeach()
endfunction()

# stillpoint_wall_check(<name> SOURCE <file> LINKS <targets>...
#                       [EXPECT_MISSING <header>])
#
# A CTest test that compiles <file> (and links nothing) with the include path
# and flags a source of a target that links <targets> gets. With
# EXPECT_MISSING the compile must fail because <header> is not found (GCC's
# and clang's messages; the wall holds); without it, it must succeed (the
# control: the same setup compiles an allowed include, so a failure above is
# the wall and not a broken probe). The probe is an object library outside `all`, built by the
# test through the build tool, one probe at a time.
function(stillpoint_wall_check name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "SOURCE;EXPECT_MISSING" "LINKS")
  set(target stillpoint_wall_probe_${name})
  add_library(${target} OBJECT EXCLUDE_FROM_ALL ${arg_SOURCE})
  target_link_libraries(${target} PRIVATE ${arg_LINKS})
  add_test(NAME wall.${name}
    COMMAND ${CMAKE_COMMAND} --build ${PROJECT_BINARY_DIR} --target ${target})
  set_tests_properties(wall.${name} PROPERTIES
    LABELS wall TIMEOUT 300 RESOURCE_LOCK stillpoint_build_tree)
  if(arg_EXPECT_MISSING)
    string(REPLACE "." "\\." header "${arg_EXPECT_MISSING}")
    set_tests_properties(wall.${name} PROPERTIES PASS_REGULAR_EXPRESSION
      "${header}: No such file or directory|'${header}' file not found")
  endif()
endfunction()
