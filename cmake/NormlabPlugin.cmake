# normlab_add_plugin(<name> [SOURCES] <files…> [OUTPUT_DIR <dir>])
# Builds a scheme plugin: a MODULE library normlab_<name>.so (dashes become underscores) with
# hidden visibility, so only the entry points exported by NORMLAB_EXPORT_SCHEME are visible.
# In normlab's own tree it lands in the build's plugins/ folder; in a user's project (after
# find_package(normlab)) in that project's build folder, found through NORMLAB_PLUGIN_PATH or a
# manifest's [run] plugin_path.
function(normlab_add_plugin name)
  cmake_parse_arguments(ARG "" "OUTPUT_DIR" "SOURCES" ${ARGN})
  set(sources ${ARG_SOURCES} ${ARG_UNPARSED_ARGUMENTS})
  if(NOT sources)
    message(FATAL_ERROR "normlab_add_plugin(${name}): no source files")
  endif()
  string(REPLACE "-" "_" id "${name}")
  set(target normlab_plugin_${id})
  add_library(${target} MODULE ${sources})
  target_link_libraries(${target} PRIVATE normlab::sdk)
  if(NOT ARG_OUTPUT_DIR)
    if(NORMLAB_PLUGIN_OUTPUT_DIR)
      set(ARG_OUTPUT_DIR ${NORMLAB_PLUGIN_OUTPUT_DIR})
    else()
      set(ARG_OUTPUT_DIR ${CMAKE_CURRENT_BINARY_DIR})
    endif()
  endif()
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    OUTPUT_NAME normlab_${id}
    LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIR}
    CXX_STANDARD 17
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(COMMAND normlab_use_plugin_pch)  # in normlab's own tree
    normlab_use_plugin_pch(${target})
  endif()
endfunction()
