# Writes OUT: #define NORMLAB_GIT_HASH "<commit>" for SOURCE_DIR ("-dirty" when tracked files
# differ from it, "unknown" outside a git checkout). Runs at every build, so the hash follows new
# commits without re-configuring; the file changes (and its users recompile) only when the hash does.
set(hash "unknown")
if(GIT_EXECUTABLE)
  execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${SOURCE_DIR}" rev-parse --short=12 HEAD
                  OUTPUT_VARIABLE head OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_QUIET)
  if(rc EQUAL 0)
    set(hash "${head}")
    execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${SOURCE_DIR}" diff --quiet HEAD --
                    RESULT_VARIABLE dirty ERROR_QUIET)
    if(NOT dirty EQUAL 0)
      string(APPEND hash "-dirty")
    endif()
  endif()
endif()
file(CONFIGURE OUTPUT "${OUT}" CONTENT "#define NORMLAB_GIT_HASH \"${hash}\"\n" @ONLY)
