# cmake -DROOT=<source root> -DHASHED=<a|b|...> -DUNHASHED=<a|b|...> -P check_hash_inputs.cmake
# (the ctest codegen_hash_inputs): fails when a codegen/ source includes a core/ or ir/ file that
# is neither hashed into the compile cache's version (source_hash.cmake) nor listed as one that
# does not decide the generated code. Philox's constants and dtype promotion were missed, so
# editing them served objects built from the old ones.
cmake_minimum_required(VERSION 3.20)  # IN_LIST
string(REPLACE "|" ";" HASHED "${HASHED}")
string(REPLACE "|" ";" UNHASHED "${UNHASHED}")
file(GLOB sources ${ROOT}/codegen/*.cpp ${ROOT}/codegen/*.h)
set(missing "")
foreach(f IN LISTS sources)
  file(STRINGS "${f}" lines REGEX "^#include \"(core|ir)/")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" inc "${line}")
    if(NOT "${ROOT}/${inc}" IN_LIST HASHED AND NOT inc IN_LIST UNHASHED)
      get_filename_component(name "${f}" NAME)
      list(APPEND missing "${inc} (included by codegen/${name})")
    endif()
  endforeach()
endforeach()
if(missing)
  list(JOIN missing "\n  " text)
  message(FATAL_ERROR "codegen includes files the compile cache's version does not hash; add "
          "them to KILN_CODEGEN_HASHED or KILN_CODEGEN_UNHASHED (codegen/CMakeLists.txt):\n  "
          "${text}")
endif()
message(STATUS "every core/ and ir/ include of codegen/ is hashed or listed as not deciding code")
