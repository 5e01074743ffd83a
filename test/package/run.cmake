# Installs troupe from TROUPE_BUILD_DIR into a scratch prefix, then configures,
# builds and runs the consumer project against it. Any failing step fails.
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()
step(${CMAKE_COMMAND} --install "${TROUPE_BUILD_DIR}" --prefix "${prefix}")
if(EXISTS "${prefix}/include/caf")
  message(FATAL_ERROR "the installed package must not ship CAF headers")
endif()
step(${CMAKE_COMMAND} -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build" -G Ninja
     -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
     -DCMAKE_CXX_FLAGS=-Werror)
step(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
step("${WORK_DIR}/build/consumer")
message(STATUS "consumer built and ran against ${prefix}")
