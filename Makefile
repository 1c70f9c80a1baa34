# Convenience wrapper around CMake. `make` builds, `make test` builds and runs
# every test, `make run` builds and runs the demo.
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
WERROR     ?= ON
CMAKE_ARGS ?=
CTEST_ARGS ?=

.PHONY: all build configure test test-asan test-tsan run install clean

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DBRAID_WERROR=$(WERROR) $(CMAKE_ARGS)

configure: $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

# ASan + UBSan build of the library and every test.
test-asan:
	cmake -S . -B $(ASAN_BUILD) -DBRAID_WERROR=$(WERROR) -DCMAKE_BUILD_TYPE=Debug \
	  -DBRAID_SANITIZE=address,undefined $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

# ThreadSanitizer build for the threaded parts (concurrent calls, abort from another thread).
test-tsan:
	cmake -S . -B $(TSAN_BUILD) -DBRAID_WERROR=$(WERROR) -DCMAKE_BUILD_TYPE=Debug \
	  -DBRAID_SANITIZE=thread $(CMAKE_ARGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	cd $(TSAN_BUILD) && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --output-on-failure -j $(JOBS) -L threads $(CTEST_ARGS)

# The main demo: 4 ranks on this host over shared memory, all-reduce from 8 B to 64 MiB.
NP      ?= 4
BACKEND ?= shm
run: build
	$(BUILD)/tools/braidrun/braidrun -n $(NP) --backend $(BACKEND) \
	  $(BUILD)/tools/braid-perf/braid-perf allreduce -b 8 -e 64M -f 4

install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX),)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
