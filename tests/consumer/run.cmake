# ctest `consumer`: configures, builds and runs tests/consumer against the build tree KILN_DIR
# (find_package(kiln) as a user's project does), in BIN with compiler CXX.
foreach(step configure build run)
  if(step STREQUAL configure)
    set(cmd ${CMAKE_COMMAND} -S ${SRC} -B ${BIN} -G Ninja -DCMAKE_BUILD_TYPE=Release
            -DCMAKE_CXX_COMPILER=${CXX} -Dkiln_DIR=${KILN_DIR})
  elseif(step STREQUAL build)
    set(cmd ${CMAKE_COMMAND} --build ${BIN})
  else()
    set(cmd ${BIN}/consumer)
  endif()
  execute_process(COMMAND ${cmd} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer: ${step} failed (${rc}): ${cmd}")
  endif()
endforeach()
