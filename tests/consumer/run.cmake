# The install_consumer test: installs the build tree into a scratch prefix, then configures, builds and
# runs tests/consumer against it through find_package(pagedattn), as an application would.
#   cmake -DSOURCE_DIR=<repo> -DBUILD_DIR=<build tree> -DWORK_DIR=<scratch> -P run.cmake
foreach(var SOURCE_DIR BUILD_DIR WORK_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "run.cmake: -D${var}=... is required")
  endif()
endforeach()

set(prefix ${WORK_DIR}/prefix)
set(consumer_build ${WORK_DIR}/build)
# Start clean: a stale prefix could hide a file the install no longer provides.
file(REMOVE_RECURSE ${WORK_DIR})

# Runs one stage; any failure ends the test with the stage's output.
function(run_stage name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install_consumer: ${name} failed (${rc}):\n${out}")
  endif()
  message(STATUS "install_consumer: ${name} ok")
  set(stage_output "${out}" PARENT_SCOPE)
endfunction()

run_stage("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

# Build the consumer with the parent's compiler, flags and generator, so that it links with the
# library as built (a sanitizer build's flags come along, for instance).
load_cache(${BUILD_DIR} READ_WITH_PREFIX parent_
  CMAKE_CXX_COMPILER CMAKE_CXX_FLAGS CMAKE_BUILD_TYPE CMAKE_GENERATOR CMAKE_MAKE_PROGRAM)
set(configure_args -S ${SOURCE_DIR}/tests/consumer -B ${consumer_build}
  -DCMAKE_PREFIX_PATH=${prefix}
  -DCMAKE_CXX_COMPILER=${parent_CMAKE_CXX_COMPILER}
  "-DCMAKE_CXX_FLAGS=${parent_CMAKE_CXX_FLAGS}"
  -DCMAKE_BUILD_TYPE=${parent_CMAKE_BUILD_TYPE})
if(parent_CMAKE_GENERATOR)
  list(APPEND configure_args -G ${parent_CMAKE_GENERATOR})
  if(parent_CMAKE_MAKE_PROGRAM)
    list(APPEND configure_args -DCMAKE_MAKE_PROGRAM=${parent_CMAKE_MAKE_PROGRAM})
  endif()
else()
  find_program(ninja ninja)
  if(ninja)
    list(APPEND configure_args -G Ninja)
  endif()
endif()
run_stage("configure" ${CMAKE_COMMAND} ${configure_args})
run_stage("build" ${CMAKE_COMMAND} --build ${consumer_build})

# The build tree's RPATH normally finds the library; LD_LIBRARY_PATH covers a toolchain that does
# not set one.
file(GLOB_RECURSE libs LIST_DIRECTORIES false ${prefix}/libpagedattn.so*)
if(NOT libs)
  message(FATAL_ERROR "install_consumer: no libpagedattn.so under ${prefix}")
endif()
list(GET libs 0 lib)
get_filename_component(lib_dir ${lib} DIRECTORY)
run_stage("run" ${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${lib_dir}:$ENV{LD_LIBRARY_PATH}"
  ${consumer_build}/consumer)
message(STATUS "consumer printed: ${stage_output}")
