# Makefile - the entry points a newcomer uses: make run, make test, make bench.
# Everything is built with CMake under build/ (normal) and build-asan/ (sanitizers); make
# test-valgrind and make test-tsan use build-valgrind/ and build-tsan/.

JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD ?= build
ASAN_BUILD ?= build-asan
VALGRIND_BUILD ?= build-valgrind
TSAN_BUILD ?= build-tsan
CMAKE_FLAGS ?=

.PHONY: install efficacy all deps build run scenario test test-unit test-asan test-valgrind test-tsan bench bench-engine bench-sim bench-daemon bench-gateway bench-streams bench-shim bench-extender fuzz format format-check clean help

all: build

help:
	@echo "make run        build everything and start oversubd in the foreground (Ctrl-C stops it)"
	@echo "make scenario   run DESIGN.md's worked scenario through the engine, decision by decision"
	@echo "make test       install what the suite needs, then run the whole suite (normal + sanitizer builds)"
	@echo "make test-valgrind  test_daemon with oversubd under valgrind memcheck (slow; not in make test)"
	@echo "make test-tsan  the daemon's integration tests on a ThreadSanitizer build (slow; not in make test)"
	@echo "make bench      run the benchmarks (bench/): engine throughput, latency, instructions, memory"
	@echo "make bench-sim  the simulator's replay rate (a synthetic week, the GenAI trace)"
	@echo "make bench-daemon  oversubd on loopback: GET /v1/pool vs nginx, durable mutations vs bare SQLite, RSS"
	@echo "make bench-gateway the gateway vs nginx and haproxy on one backend, and its rejection path"
	@echo "make bench-shim what liboversub-cuda.so adds to a cuMemAlloc/cuMemFree pair (fake driver)"
	@echo "make bench-extender oversub-scheduler: filter + prioritize for one pod across 1,000 nodes (real oversubd)"
	@echo "make efficacy   the GPUs saved on held-back pods, other GPU sizes, buffers, class mixes and synthetic traces (docs/results.md)"
	@echo "make format     clang-format every C file in place"
	@echo "make install    install into PREFIX (/usr/local; DESTDIR= for staging): docs/operations.md"
	@echo "make clean      remove the build folders"

deps:
	@scripts/install-deps.sh build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOSUB_WERROR=$${OSUB_WERROR:-ON} $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build
	@mkdir -p var
	@echo "oversubd: state in var/oversub.db, API on 127.0.0.1:7070 and var/oversub.sock"
	@echo "try:  curl -s localhost:7070/v1/pool"
	@echo "      curl -s -X POST localhost:7070/v1/services -H 'Content-Type: application/json' -d '{\"id\":\"chat\",\"class\":\"online\",\"vram\":\"40GiB\"}'"
	@echo "      curl -s localhost:7070/metrics | head"
	@echo "      build/oversub demo     (the worked scenario on a daemon of its own)"
	@echo "gateway: services submitted with \"backends\" answer on localhost:8080/{service}/..."
	@if [ "$$(id -u)" = 0 ]; then echo "make run as root: managed services given no user run as root (--allow-root-services; the installed configuration refuses it)"; fi
	./$(BUILD)/oversubd --config oversub.yaml $$([ "$$(id -u)" = 0 ] && echo --allow-root-services)

scenario: build
	./$(BUILD)/oversub-scenario

test: 
	@scripts/install-deps.sh test
	$(MAKE) --no-print-directory test-unit test-asan

test-unit: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

$(ASAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DOSUB_SANITIZE=ON -DOSUB_WERROR=ON -DOSUB_BENCH=OFF $(CMAKE_FLAGS)

test-asan: deps $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:verify_asan_link_order=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		ctest --output-on-failure -j $(JOBS)

# Hardening checks, slow, so not part of make test. test-valgrind: a plain Debug build, then
# test_daemon and test_security with tests/integration/valgrind-wrap.sh in place of oversubd (memcheck, one log per
# process in $(VALGRIND_BUILD)/vg); any error logged, even by a daemon the test kills with -9,
# or any block definitely lost fails it.
$(VALGRIND_BUILD)/CMakeCache.txt:
	cmake -S . -B $(VALGRIND_BUILD) -DCMAKE_BUILD_TYPE=Debug -DOSUB_SANITIZE=OFF -DOSUB_TSAN=OFF -DOSUB_BENCH=OFF $(CMAKE_FLAGS)

test-valgrind: $(VALGRIND_BUILD)/CMakeCache.txt
	@scripts/install-deps.sh test
	cmake --build $(VALGRIND_BUILD) -j $(JOBS)
	rm -rf $(VALGRIND_BUILD)/vg
	OSUB_VG_BIN=$(abspath $(VALGRIND_BUILD))/oversubd OSUB_VG_LOGDIR=$(abspath $(VALGRIND_BUILD))/vg \
		bash tests/integration/test_daemon.sh tests/integration/valgrind-wrap.sh $(VALGRIND_BUILD)/oversub; \
	st=$$?; \
	OSUB_VG_BIN=$(abspath $(VALGRIND_BUILD))/oversubd OSUB_VG_LOGDIR=$(abspath $(VALGRIND_BUILD))/vg \
		bash tests/integration/test_security.sh tests/integration/valgrind-wrap.sh || st=1; \
	echo "test-valgrind: $$(ls $(VALGRIND_BUILD)/vg | wc -l) processes under memcheck, logs in $(VALGRIND_BUILD)/vg"; \
	if grep -lE 'VGERR-BEGIN|ERROR SUMMARY: [1-9]|definitely lost: [1-9]' $(VALGRIND_BUILD)/vg/vg.*.log; then \
		echo "test-valgrind: memcheck found errors in the logs above"; st=1; fi; \
	exit $$st

# test-tsan: a ThreadSanitizer build (-fsanitize=thread, OSUB_TSAN) and the daemon's integration
# tests on it; every report goes to $(TSAN_BUILD)/tsan/tsan.PID (the tests discard the daemon's
# stderr) and fails the run. Without ASLR (setarch -R): TSan maps fixed ranges, and kernels
# with more mmap randomisation bits than it knows refuse it ("unexpected memory mapping").
# No -Werror here: warnings are make test's to catch; this one is for races.
TSAN_TESTS ?= ^(test_security|test_daemon|test_gateway|test_state|test_actuation|test_shim|test_nvml|test_frontdoor|test_store|test_segment)$$

$(TSAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DOSUB_TSAN=ON -DOSUB_SANITIZE=OFF -DOSUB_WERROR=OFF -DOSUB_BENCH=OFF $(CMAKE_FLAGS)

test-tsan: $(TSAN_BUILD)/CMakeCache.txt
	@scripts/install-deps.sh test
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	rm -rf $(TSAN_BUILD)/tsan && mkdir -p $(TSAN_BUILD)/tsan
	cd $(TSAN_BUILD) && TSAN_OPTIONS="log_path=$(abspath $(TSAN_BUILD))/tsan/tsan second_deadlock_stack=1 $${TSAN_OPTIONS:-}" \
		setarch $$(uname -m) -R ctest --output-on-failure -j $(JOBS) -R '$(TSAN_TESTS)'; \
	st=$$?; \
	if grep -l 'ThreadSanitizer' $(abspath $(TSAN_BUILD))/tsan/tsan.* 2>/dev/null; then \
		echo "test-tsan: ThreadSanitizer reports in the files above"; st=1; fi; \
	exit $$st

# make install [PREFIX=/usr/local] [DESTDIR=...]: the daemon, the CLI, the shim, the engine
# library with its headers and pkg-config file, man pages, the example configuration, the
# systemd unit and sysusers file, bash completion, Prometheus rules and the Grafana dashboard
PREFIX ?= /usr/local
install: build
	cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)
	DESTDIR=$(DESTDIR) cmake --install $(BUILD)

bench: bench-engine bench-sim bench-daemon bench-gateway bench-streams bench-shim bench-extender

bench-extender:
	@scripts/install-deps.sh build
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS) --target oversubd oversub-scheduler
	/usr/bin/python3 bench/extender_load.py $(BUILD)/oversubd $(BUILD)/oversub-scheduler

bench-shim:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS) --target oversub-cuda bench_shim
	./bench/run-shim.sh $(BUILD)

fuzz:
	@scripts/install-deps.sh test
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS) --target fuzz_h1_bin h1dump
	bash tests/fuzz/run_h1.sh $(BUILD)/tests/fuzz_h1 $(BUILD)/tests/h1dump $${FUZZ_SECONDS:-600}

bench-streams:
	@scripts/install-deps.sh bench
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS) --target oversubd bench_backend bench_streams
	./bench/run-streams.sh $(BUILD)

bench-gateway:
	@scripts/install-deps.sh bench
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS) --target oversubd bench_backend bench_openloop
	./bench/run-gateway.sh $(BUILD)

bench-daemon:
	@scripts/install-deps.sh bench
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS) --target oversubd bench_store
	./bench/run-daemon.sh $(BUILD)

efficacy: build
	python3 scripts/efficacy.py --oversub $(BUILD)/oversub --gentrace $(BUILD)/oversub-gentrace

bench-sim:
	@scripts/install-deps.sh build
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS) --target bench_sim
	./$(BUILD)/bench/bench_sim --runs 3 $$( [ -d ../shared/traces ] && echo --genai ../shared/traces )

bench-engine:
	@scripts/install-deps.sh bench
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS) --target bench_engine
	./bench/run-engine.sh $(BUILD)

format:
	git ls-files '*.c' '*.h' | xargs clang-format -i

format-check:
	git ls-files '*.c' '*.h' | xargs clang-format --dry-run --Werror

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(VALGRIND_BUILD) $(TSAN_BUILD)
