# Optional parts (CUDA, NCCL, MPI, the Python package) switch on when found; GIFT_WITH_<X>=ON makes a missing one
# an error, OFF skips it. Everything else is required.

set(GIFT_WITH_CUDA AUTO CACHE STRING "Build CUDA parts: AUTO, ON or OFF")
set(GIFT_WITH_NCCL AUTO CACHE STRING "Build the NCCL transport: AUTO, ON or OFF")
set(GIFT_WITH_MPI AUTO CACHE STRING "Build the MPI transport: AUTO, ON or OFF")
set(GIFT_PYTHON AUTO CACHE STRING "Build the Python package (pybind11): AUTO, ON or OFF")
foreach(opt GIFT_WITH_CUDA GIFT_WITH_NCCL GIFT_WITH_MPI GIFT_PYTHON)
  set_property(CACHE ${opt} PROPERTY STRINGS AUTO ON OFF)
endforeach()

function(gift_require_or_note opt found what)
  if(${opt} STREQUAL "ON" AND NOT found)
    message(FATAL_ERROR "${opt}=ON but ${what} was not found")
  endif()
endfunction()

# Our own targets: warnings are errors (OFF only for builds on machines whose newer
# compiler may warn where CI's does not), and no floating-point contraction, because an FMA
# that fuses the scale multiply with the rounding add would change FP8 codes.
option(GIFT_WARNINGS_AS_ERRORS "Treat warnings in the project's own code as errors" ON)
set(GIFT_CXX_FLAGS -Wall -Wextra -ffp-contract=off)
set(GIFT_CUDA_FLAGS --fmad=false -Xcompiler=-Wall,-Wextra)
if(GIFT_WARNINGS_AS_ERRORS)
  list(APPEND GIFT_CXX_FLAGS -Werror)
  list(APPEND GIFT_CUDA_FLAGS -Werror=all-warnings)
endif()
# GCC's sanitizers make -Wmaybe-uninitialized misfire (its manual advises against -Werror with
# them: libstdc++'s headers trip it under ASan). Sanitized GCC builds (scripts/sanitize.sh) go
# without that one warning.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_FLAGS MATCHES "-fsanitize=")
  list(APPEND GIFT_CXX_FLAGS -Wno-maybe-uninitialized)
endif()

# The libFuzzer harnesses (tests/fuzz), with Clang. GIFT_FUZZ_FLAGS instruments for libFuzzer's
# coverage the code that takes untrusted bytes apart (libcodec and cli/io apply it to theirs);
# the project's other executables run that code too, the sanitizer runtimes defining the
# callbacks. scripts/sanitized-build.sh turns it on in its ASan tree, whose tests and fuzzers
# thus share one build.
option(GIFT_FUZZERS "Build the libFuzzer harnesses, instrumenting the readers for them (Clang)" OFF)
set(GIFT_FUZZ_FLAGS "")
if(GIFT_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "GIFT_FUZZERS=ON needs Clang (configure with CC=clang CXX=clang++)")
  endif()
  # Without a sanitizer runtime nothing defines the coverage callbacks.
  if(NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize=")
    message(FATAL_ERROR "GIFT_FUZZERS=ON needs a sanitizer in CMAKE_CXX_FLAGS "
                        "(scripts/sanitized-build.sh asan configures one)")
  endif()
  set(GIFT_FUZZ_FLAGS -fsanitize=fuzzer-no-link)
endif()

# Headers that configuring generates (gift/gift_version.h, libcodec/CMakeLists.txt); whatever
# includes gift.h needs this folder.
set(GIFT_GENERATED_INCLUDE_DIR ${PROJECT_BINARY_DIR}/include)

find_package(OpenMP REQUIRED COMPONENTS CXX)
find_program(FLATC flatc REQUIRED)
set(GIFT_FBS ${PROJECT_SOURCE_DIR}/format/gift.fbs)
find_package(PkgConfig REQUIRED)
pkg_check_modules(HWY REQUIRED IMPORTED_TARGET libhwy)
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu/openblas-pthread
          REQUIRED)
find_package(LAPACK REQUIRED)
find_library(LAPACKE_LIBRARY lapacke REQUIRED)
# libgift loads BLAS and LAPACKE when first needed (numerics/linalg.cc), by the sonames of the
# libraries found here: the names a program would have been linked to.
function(gift_soname library out)
  execute_process(COMMAND ${CMAKE_OBJDUMP} -p ${library} OUTPUT_VARIABLE dump
                  RESULT_VARIABLE failed ERROR_QUIET)
  if(failed OR NOT dump MATCHES "SONAME +([^\r\n ]+)")
    message(FATAL_ERROR "${library}: no soname (objdump -p)")
  endif()
  set(${out} ${CMAKE_MATCH_1} PARENT_SCOPE)
endfunction()
list(GET BLAS_LIBRARIES 0 GIFT_BLAS_LIBRARY)
gift_soname(${GIFT_BLAS_LIBRARY} GIFT_BLAS_SONAME)
gift_soname(${LAPACKE_LIBRARY} GIFT_LAPACKE_SONAME)

# CUDA: the toolkit's headers serve CPU tests as a reference even without a GPU.
set(GIFT_HAVE_CUDA OFF)
if(NOT GIFT_WITH_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # SASS for A100 and H100/H200, plus PTX of the newest for later GPUs.
      set(CMAKE_CUDA_ARCHITECTURES 80-real 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(GIFT_HAVE_CUDA ON)
  endif()
endif()
gift_require_or_note(GIFT_WITH_CUDA "${GIFT_HAVE_CUDA}" "a CUDA compiler")

set(GIFT_HAVE_NCCL OFF)
if(GIFT_HAVE_CUDA AND NOT GIFT_WITH_NCCL STREQUAL "OFF")
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  if(NCCL_LIBRARY AND NCCL_INCLUDE_DIR)
    set(GIFT_HAVE_NCCL ON)
  endif()
endif()
gift_require_or_note(GIFT_WITH_NCCL "${GIFT_HAVE_NCCL}" "NCCL (with CUDA)")

set(GIFT_HAVE_MPI OFF)
if(NOT GIFT_WITH_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS C QUIET)
  if(MPI_C_FOUND)
    set(GIFT_HAVE_MPI ON)
  endif()
endif()
gift_require_or_note(GIFT_WITH_MPI "${GIFT_HAVE_MPI}" "MPI")

# The Python package needs the interpreter's development files and pybind11 (found first so
# that pybind11 uses CMake's FindPython3 and builds for that interpreter).
set(GIFT_HAVE_PYTHON OFF)
if(NOT GIFT_PYTHON STREQUAL "OFF")
  find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
  if(Python3_Development.Module_FOUND)
    find_package(pybind11 CONFIG QUIET)
    if(pybind11_FOUND)
      set(GIFT_HAVE_PYTHON ON)
    endif()
  endif()
endif()
gift_require_or_note(GIFT_PYTHON "${GIFT_HAVE_PYTHON}" "Python development files and pybind11")
