# Convenience wrapper around CMake. `make` builds, `make test` builds and runs
# every test, `make run` builds and runs the demo.
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
WERROR     ?= ON
CMAKE_ARGS ?=
CTEST_ARGS ?=
PYTHON     ?= /usr/bin/python3

# Parallel jobs of `cmake --build` and ctest: JOBS when given (`make JOBS=2
# test`, or in the environment), else make's own -jN (`make -j1 test` builds
# and tests with one job), else one per core.
ifneq ($(filter command line environment,$(origin JOBS)),)
J = $(JOBS)
else
J = $(or $(patsubst -j%,%,$(filter -j%,$(MAKEFLAGS))),$(shell nproc 2>/dev/null || echo 2))
endif

.PHONY: all build configure test test-asan test-tsan run install clean

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DBRAID_WERROR=$(WERROR) $(CMAKE_ARGS)

configure: $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(J)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(J) $(CTEST_ARGS)

# ASan + UBSan build of the library and every test.
test-asan:
	cmake -S . -B $(ASAN_BUILD) -DBRAID_WERROR=$(WERROR) -DCMAKE_BUILD_TYPE=Debug \
	  -DBRAID_SANITIZE=address,undefined $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(J)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(J) -LE net $(CTEST_ARGS)

# ThreadSanitizer build for the threaded parts (concurrent calls, abort from another thread).
test-tsan:
	cmake -S . -B $(TSAN_BUILD) -DBRAID_WERROR=$(WERROR) -DCMAKE_BUILD_TYPE=Debug \
	  -DBRAID_SANITIZE=thread $(CMAKE_ARGS)
	cmake --build $(TSAN_BUILD) -j $(J)
	cd $(TSAN_BUILD) && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --output-on-failure -j $(J) -L threads $(CTEST_ARGS)

# The main demo: 4 ranks on this host over shared memory, all-reduce from 8 B
# to 32 MiB, x4 per step (8 B x 4^11 = 32 MiB; the next step would pass -e 64M).
NP      ?= 4
BACKEND ?= shm
run: build
	$(BUILD)/tools/braidrun/braidrun -n $(NP) --backend $(BACKEND) \
	  $(BUILD)/tools/braid-perf/braid-perf allreduce -b 8 -e 64M -f 4

# The C library, header, braid.pc, CMake package and tools; then the Python
# package (python/braid) into PREFIX's site-packages, set to load PREFIX's
# libbraid (python/install.py; PYTHON_SITEDIR=DIR to choose the directory).
install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX),)
	@if [ -x "$(PYTHON)" ]; then \
	  $(PYTHON) python/install.py --build $(BUILD) $(if $(PREFIX),--prefix "$(PREFIX)",) \
	    $(if $(PYTHON_SITEDIR),--sitedir "$(PYTHON_SITEDIR)",); \
	else echo "-- $(PYTHON) not found: the Python package (python/) was not installed"; fi

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
