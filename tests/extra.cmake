# The generic algorithms on simulated ranks (tests/unit/sim_algos.c). Its
# own executable from the algorithm sources and the reduction kernels, with a
# test double of core/p2p.h in place of the core's point-to-point layer, so
# it does not link braid_static (whose core defines the same functions). The
# file is not named test_*.c to stay out of the glob above.
file(GLOB BRAID_SIM_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/algos/*.c)
list(APPEND BRAID_SIM_SOURCES
  ${CMAKE_CURRENT_SOURCE_DIR}/unit/sim_algos.c
  ${PROJECT_SOURCE_DIR}/src/core/reduce.c
  ${PROJECT_SOURCE_DIR}/src/core/dtype.c)
set(BRAID_SIM_DEFS "")
# The descriptor helpers come from the core when it has them, else the double.
if(EXISTS ${PROJECT_SOURCE_DIR}/src/core/desc.c)
  list(APPEND BRAID_SIM_SOURCES ${PROJECT_SOURCE_DIR}/src/core/desc.c)
  list(APPEND BRAID_SIM_DEFS SIM_HAVE_DESC_C=1)
endif()
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64")
  set(BRAID_SIM_AVX2 ${PROJECT_SOURCE_DIR}/src/core/reduce_avx2.c)
  set(BRAID_SIM_AVX512 ${PROJECT_SOURCE_DIR}/src/core/reduce_avx512.c)
  list(APPEND BRAID_SIM_SOURCES ${BRAID_SIM_AVX2} ${BRAID_SIM_AVX512})
  # Source file properties are per directory: the top level's do not reach here.
  set_source_files_properties(${BRAID_SIM_AVX2} PROPERTIES COMPILE_OPTIONS "-mavx2;-mf16c")
  set_source_files_properties(${BRAID_SIM_AVX512} PROPERTIES
    COMPILE_OPTIONS "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx2;-mf16c")
endif()
add_executable(test_algos_sim ${BRAID_SIM_SOURCES})
target_include_directories(test_algos_sim PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
target_compile_definitions(test_algos_sim PRIVATE ${BRAID_SIM_DEFS})
target_link_libraries(test_algos_sim PRIVATE Threads::Threads m)
add_test(NAME test_algos_sim COMMAND test_algos_sim)
# One thread per simulated rank: it also runs under ThreadSanitizer (make test-tsan).
set_tests_properties(test_algos_sim PROPERTIES TIMEOUT 600 LABELS threads)
