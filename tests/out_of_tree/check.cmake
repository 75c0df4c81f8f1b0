# Installs this build into a temporary prefix, builds tests/out_of_tree against it as a user
# would, lists the plugin with the installed normlab and trains a few updates with it.
# -D BUILD_DIR, SOURCE_DIR, WORK_DIR, PREFIX_PATH (LibTorch's), GENERATOR
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()
# The build tree is not a package: CMAKE_PREFIX_PATH pointing at it finds no normlab config (it
# found one whose targets file did not exist: raw CMake errors, issue 46.7).
file(WRITE ${WORK_DIR}/probe/CMakeLists.txt "cmake_minimum_required(VERSION 3.25)
project(probe LANGUAGES NONE)
find_package(normlab QUIET)
if(normlab_FOUND)
  message(FATAL_ERROR \"normlab found in the build tree\")
endif()
")
run(${CMAKE_COMMAND} -S ${WORK_DIR}/probe -B ${WORK_DIR}/probe/build -G ${GENERATOR}
    "-DCMAKE_PREFIX_PATH=${BUILD_DIR}")
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
# The user's project: the built-in ReZero's source (the example of docs/writing-a-scheme.md) under
# another name, since the installed normlab already has a "rezero".
file(READ ${SOURCE_DIR}/plugins/rezero/rezero.cpp code)
string(REPLACE "(ReZero, \"rezero\"" "(ReZero, \"my-rezero\"" user_code "${code}")
file(WRITE ${WORK_DIR}/src/rezero.cpp "${user_code}")
configure_file(${SOURCE_DIR}/tests/out_of_tree/CMakeLists.txt ${WORK_DIR}/src/CMakeLists.txt COPYONLY)
run(${CMAKE_COMMAND} -S ${WORK_DIR}/src -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
set(ENV{NORMLAB_PLUGIN_PATH} ${WORK_DIR}/build)
run(${WORK_DIR}/prefix/bin/normlab plugins list)
if(NOT out MATCHES "my-rezero +1.0.0 +[0-9]+ +${WORK_DIR}/build/normlab_my_rezero.so")
  message(FATAL_ERROR "the installed normlab does not list the out-of-tree plugin:\n${out}")
endif()
# `normlab plugins new` writes a starting point that builds as is and loads.
run(${WORK_DIR}/prefix/bin/normlab plugins new my-scheme --dir ${WORK_DIR}/new)
run(${CMAKE_COMMAND} -S ${WORK_DIR}/new/my-scheme -B ${WORK_DIR}/new/build -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
run(${CMAKE_COMMAND} --build ${WORK_DIR}/new/build)
set(ENV{NORMLAB_PLUGIN_PATH} ${WORK_DIR}/new/build)
run(${WORK_DIR}/prefix/bin/normlab plugins show my-scheme --dec-layers 4)
if(NOT out MATCHES "init_scale +float +1 " OR NOT out MATCHES "layers +decoder +4")
  message(FATAL_ERROR "the generated plugin does not show its parameter and derived value:\n${out}")
endif()
unset(ENV{NORMLAB_PLUGIN_PATH})
set(manifest_text "[model]
d_model = 32
ffn_dim = 64
heads = 2
enc_layers = 2
dec_layers = 2
[scheme]
name = \"my-rezero\"
init = 0.0
[data]
task = \"copy\"
synthetic_train = 500
synthetic_valid = 20
cache_dir = \"${WORK_DIR}/cache\"
[optim]
max_updates = 20
warmup_updates = 5
max_tokens = 256
[eval]
bleu = false
[run]
out_dir = \"${WORK_DIR}/run\"
log_interval = 10
threads = 1
plugin_path = [\"build\"]
")
file(WRITE ${WORK_DIR}/rezero.toml "${manifest_text}")
run(${WORK_DIR}/prefix/bin/normlab train ${WORK_DIR}/rezero.toml)
if(NOT out MATCHES "scheme my-rezero .*completed 20 updates")
  message(FATAL_ERROR "training with the out-of-tree plugin did not complete:\n${out}")
endif()
message(STATUS "out-of-tree plugin built, listed and trained:\n${out}")
# Found through NORMLAB_PLUGIN_PATH alone (issue 27.15): the resolved manifest records the folder,
# so `eval` of that run finds the plugin without the variable.
string(REPLACE "plugin_path = [\"build\"]\n" "" env_manifest "${manifest_text}")
string(REPLACE "${WORK_DIR}/run" "${WORK_DIR}/run_env" env_manifest "${env_manifest}")
file(WRITE ${WORK_DIR}/rezero_env.toml "${env_manifest}")
set(ENV{NORMLAB_PLUGIN_PATH} ${WORK_DIR}/build)
run(${WORK_DIR}/prefix/bin/normlab train ${WORK_DIR}/rezero_env.toml)
unset(ENV{NORMLAB_PLUGIN_PATH})
file(READ ${WORK_DIR}/run_env/manifest.resolved.toml resolved)
if(NOT resolved MATCHES "plugin_path = \\[['\"]${WORK_DIR}/build['\"]\\]")
  message(FATAL_ERROR "the resolved manifest does not record NORMLAB_PLUGIN_PATH's folder:\n${resolved}")
endif()
run(${WORK_DIR}/prefix/bin/normlab eval ${WORK_DIR}/run_env --split valid --beam 1)
message(STATUS "a run trained with NORMLAB_PLUGIN_PATH evaluates without it:\n${out}")
# docs/writing-a-scheme.md shows this very plugin: its code block must stay identical to
# plugins/rezero/rezero.cpp.
file(READ ${SOURCE_DIR}/docs/writing-a-scheme.md readme)
string(FIND "${code}" "#include <normlab/sdk.h>" at)
string(SUBSTRING "${code}" ${at} -1 body)
string(FIND "${readme}" "${body}" found)
if(found EQUAL -1)
  message(FATAL_ERROR "docs/writing-a-scheme.md's plugin example differs from plugins/rezero/rezero.cpp")
endif()
