# KVFLEET_SANITIZE and KVFLEET_FUZZ on kvfleet_flags (every target of ours links it).
#   ON / TRUE / 1      -> -fsanitize=address,undefined
#   any other non-off  -> -fsanitize=<that list>, e.g. "thread"
# UBSan findings abort (-fno-sanitize-recover) so that a test or a fuzz run fails on them instead of
# printing a line nobody reads. With clang 14, UBSan's "function" check cannot compile C++20 coroutines
# ("Cannot represent a difference across sections"), so it is left out there; it only checks calls
# through function pointers of the wrong type.
set(kvfleet_sanitizers "")
if(KVFLEET_SANITIZE MATCHES "^(ON|On|on|TRUE|True|true|YES|Yes|yes|1)$")
  set(kvfleet_sanitizers "address,undefined")
elseif(NOT KVFLEET_SANITIZE MATCHES "^(OFF|Off|off|FALSE|False|false|NO|No|no|0|)$")
  set(kvfleet_sanitizers "${KVFLEET_SANITIZE}")
endif()
if(KVFLEET_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "KVFLEET_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++ "
                        "-DCMAKE_C_COMPILER=clang (scripts/fuzz-build does)")
  endif()
  if(kvfleet_sanitizers STREQUAL "")
    set(kvfleet_sanitizers "address,undefined")
  endif()
endif()

if(NOT kvfleet_sanitizers STREQUAL "")
  set(kvfleet_sanitize_flags -fsanitize=${kvfleet_sanitizers} -fno-omit-frame-pointer)
  if(kvfleet_sanitizers MATCHES "undefined")
    list(APPEND kvfleet_sanitize_flags -fno-sanitize-recover=undefined)
    if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
      list(APPEND kvfleet_sanitize_flags -fno-sanitize=function)
    endif()
  endif()
  # C and C++ only: nvcc does not take -fsanitize (CUDA sources keep their own flags).
  target_compile_options(kvfleet_flags INTERFACE $<$<COMPILE_LANGUAGE:C,CXX>:${kvfleet_sanitize_flags}>)
  target_link_options(kvfleet_flags INTERFACE -fsanitize=${kvfleet_sanitizers})
  message(STATUS "kvfleet: sanitizers ${kvfleet_sanitizers}")
endif()
if(KVFLEET_FUZZ)
  # Coverage instrumentation for libFuzzer in every library; only the fuzz targets link the fuzzer's main.
  target_compile_options(kvfleet_flags INTERFACE $<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>)
endif()
