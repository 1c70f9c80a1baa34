# Tests of the language bindings, included from tests/CMakeLists.txt:
#
#   python_nN        tests/python (numpy) under braidrun -n N, N = 1..4
#   python_torch_nN  tests/python/test_torch.py (and test_cuda.py, which needs
#                    a GPU and backend nccl, else skips) under braidrun -n N
#   python_example_* examples/python under braidrun
#   python_install   make install's and pip's offline installs of the package
#   rust_nN          the rust/braid crate's tests under braidrun -n N
#   braidrun_cannot_start  braidrun's report of a rank that cannot start
#
# The Python tests use BRAID_PYTHON (Debian's /usr/bin/python3: the python3
# first on PATH may be another one without Debian's packages) with
# PYTHONPATH=python/ and BRAID_LIBRARY=the libbraid.so built here. A missing
# interpreter, Python package or Rust toolchain makes the test report
# SKIPPED (exit status 77, SKIP_RETURN_CODE) with the reason and the Debian
# package to install; nothing passes silently.

set(BRAID_PYTHON /usr/bin/python3 CACHE FILEPATH "Python 3 for the Python package's tests (with numpy and pytest)")
# Debian's cargo (/usr/bin) before any other on PATH (e.g. a rustup install in
# ~/.cargo/bin): CI installs Debian's, and the tests must build with it,
# offline. run_tests.sh uses the rustc beside the cargo it is given.
find_program(BRAID_CARGO NAMES cargo HINTS /usr/bin DOC "cargo for the Rust crate's tests")

function(braid_skip_test name reason)
  add_test(NAME ${name} COMMAND sh -c "echo 'SKIPPED: ${reason}'; exit 77")
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 LABELS bindings)
endfunction()

if(NOT TARGET braidrun)
  braid_skip_test(python_bindings "braidrun is not built (BRAID_BUILD_TOOLS=OFF)")
  braid_skip_test(rust_bindings "braidrun is not built (BRAID_BUILD_TOOLS=OFF)")
  return()
endif()

if(BRAID_SANITIZE)
  # libbraid is instrumented; python3 and the Rust test binaries are not (the
  # sanitizer runtime would have to come first in the process).
  add_test(NAME braidrun_cannot_start
    COMMAND bash ${PROJECT_SOURCE_DIR}/tests/python/check_braidrun_start.sh $<TARGET_FILE:braidrun>
      $<TARGET_FILE_DIR:braid> ${PROJECT_SOURCE_DIR}/include launcher-only)
  set_tests_properties(braidrun_cannot_start PROPERTIES TIMEOUT 120 LABELS bindings)
  braid_skip_test(python_bindings "the Python tests do not run in sanitizer builds (BRAID_SANITIZE=${BRAID_SANITIZE})")
  braid_skip_test(rust_bindings "the Rust tests do not run in sanitizer builds (BRAID_SANITIZE=${BRAID_SANITIZE})")
  return()
endif()

set(_bind_py_run ${PROJECT_SOURCE_DIR}/tests/python/run.sh)
set(_bind_py_env
  "PYTHONPATH=${PROJECT_SOURCE_DIR}/python"
  "BRAID_LIBRARY=$<TARGET_FILE:braid>"
  "PYTHONDONTWRITEBYTECODE=1"
  "BRAID_TIMEOUT=120")
set(_bind_pytest -m pytest -q -p no:cacheprovider)
set(_bind_tests ${PROJECT_SOURCE_DIR}/tests/python)

foreach(n 1 2 3 4)
  add_test(NAME python_n${n}
    COMMAND bash ${_bind_py_run} ${n} $<TARGET_FILE:braidrun> ${BRAID_PYTHON} numpy,pytest ${_bind_pytest}
      ${_bind_tests}/test_collectives.py ${_bind_tests}/test_errors.py ${_bind_tests}/test_comm_memory.py
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  add_test(NAME python_torch_n${n}
    COMMAND bash ${_bind_py_run} ${n} $<TARGET_FILE:braidrun> ${BRAID_PYTHON} numpy,pytest,torch ${_bind_pytest}
      ${_bind_tests}/test_torch.py ${_bind_tests}/test_cuda.py
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(python_n${n} python_torch_n${n} PROPERTIES
    ENVIRONMENT "${_bind_py_env}" SKIP_RETURN_CODE 77 TIMEOUT 900 LABELS "bindings;python")
endforeach()

# The binding's stream/event hooks on backend nccl, against the NCCL stand-in.
if(TARGET braid_nccl_double)
  add_test(NAME python_nccl_double
    COMMAND bash ${_bind_py_run} 2 $<TARGET_FILE:braidrun> ${BRAID_PYTHON} numpy,pytest ${_bind_pytest}
      ${_bind_tests}/test_nccl_double.py
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(python_nccl_double PROPERTIES
    ENVIRONMENT "${_bind_py_env};BT_BRAIDRUN_ARGS=--backend nccl;BT_NCCL_DOUBLE=1;BRAID_NCCL_LIB=$<TARGET_FILE:braid_nccl_double>;BRAID_CUDART_LIB=$<TARGET_FILE:braid_nccl_double>"
    SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS "bindings;python")
endif()

add_test(NAME python_example_allreduce_numpy
  COMMAND bash ${_bind_py_run} 4 $<TARGET_FILE:braidrun> ${BRAID_PYTHON} numpy
    ${PROJECT_SOURCE_DIR}/examples/python/allreduce_numpy.py
  WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
add_test(NAME python_example_torch_ddp
  COMMAND bash ${_bind_py_run} 2 $<TARGET_FILE:braidrun> ${BRAID_PYTHON} numpy,torch
    ${PROJECT_SOURCE_DIR}/examples/python/torch_ddp.py --steps 20
  WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(python_example_allreduce_numpy python_example_torch_ddp PROPERTIES
  ENVIRONMENT "${_bind_py_env}" SKIP_RETURN_CODE 77 TIMEOUT 900 LABELS "bindings;python")

add_test(NAME python_install
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/python/check_install.sh ${PROJECT_BINARY_DIR} ${BRAID_PYTHON})
set_tests_properties(python_install PROPERTIES
  ENVIRONMENT "CMAKE=${CMAKE_COMMAND}" SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS "bindings;python")

if(BRAID_CARGO)
  set(_bind_cargo ${BRAID_CARGO})
else()
  set(_bind_cargo cargo) # looked up again when the test runs; absent: SKIPPED
endif()
foreach(n 1 2 3 4)
  add_test(NAME rust_n${n}
    COMMAND bash ${PROJECT_SOURCE_DIR}/rust/braid/run_tests.sh ${n} $<TARGET_FILE:braidrun>
      $<TARGET_FILE_DIR:braid> ${PROJECT_BINARY_DIR}/rust-target ${_bind_cargo})
  set_tests_properties(rust_n${n} PROPERTIES
    ENVIRONMENT "BRAID_TIMEOUT=120" SKIP_RETURN_CODE 77 TIMEOUT 900 LABELS "bindings;rust"
    RESOURCE_LOCK braid_rust_target)
endforeach()

add_test(NAME braidrun_cannot_start
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/python/check_braidrun_start.sh $<TARGET_FILE:braidrun>
    $<TARGET_FILE_DIR:braid> ${PROJECT_SOURCE_DIR}/include)
set_tests_properties(braidrun_cannot_start PROPERTIES TIMEOUT 120 LABELS bindings)
