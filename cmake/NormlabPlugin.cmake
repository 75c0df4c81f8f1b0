# normlab_add_plugin(<scheme-dir-name> SOURCES <files…> [OUTPUT_DIR <dir>])
# Builds a scheme plugin: a MODULE library named normlab_<name>.so with hidden visibility, so only
# the entry points exported by NORMLAB_EXPORT_SCHEME are visible.
function(normlab_add_plugin name)
  cmake_parse_arguments(ARG "" "OUTPUT_DIR" "SOURCES" ${ARGN})
  set(target normlab_plugin_${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE normlab::sdk)
  if(NOT ARG_OUTPUT_DIR)
    set(ARG_OUTPUT_DIR ${NORMLAB_PLUGIN_OUTPUT_DIR})
  endif()
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    OUTPUT_NAME normlab_${name}
    LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIR}
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(COMMAND normlab_use_pch)
    normlab_use_pch(${target})
  endif()
endfunction()
