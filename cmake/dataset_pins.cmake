# normlab_dataset_pins(SOURCE_DIR OUT_DIR): writes OUT_DIR/dataset_pins.inc, the SHA-256 pins of
# SOURCE_DIR/scripts/datasets/NAME.sha256 as C++ initializers {"NAME", "hex  file\n…"}, and makes
# the configure step depend on them. Used by core/ and by the manifest fuzzer's sub-build.
function(normlab_dataset_pins source_dir out_dir)
  file(GLOB pin_files CONFIGURE_DEPENDS ${source_dir}/scripts/datasets/*.sha256)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${pin_files})
  set(entries "")
  foreach(pin_file ${pin_files})
    get_filename_component(pin_name ${pin_file} NAME_WE)
    file(READ ${pin_file} pin_text)
    string(APPEND entries "{\"${pin_name}\", R\"NLPIN(${pin_text})NLPIN\"},\n")
  endforeach()
  file(CONFIGURE OUTPUT ${out_dir}/dataset_pins.inc CONTENT "${entries}")
endfunction()
