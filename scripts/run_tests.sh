#!/usr/bin/env bash
# Every test in one command: installs the dependencies, then
#   1. a Release build in build/ and all its tests;
#   2. a Release build with x64:amx on emulated tiles (PAGEDATTN_AMX_EMULATOR=ON) in
#      build-amx-emulator/ and all its tests: the AMX kernel through every suite on a host without AMX;
#   3. an ASan+UBSan build with clang in build-sanitize/ (the AMX emulator on too, so that the AMX
#      kernel's loads and stores are checked) and its tests at reduced sizes
#      (PAGEDATTN_TEST_REDUCED=1; the install test is left out);
#   4. a ThreadSanitizer build with clang in build-tsan/ (AMX emulator on) of the library and the
#      concurrency suites (label `concurrency`), run at reduced sizes;
#   5. a build without the x86 kernels (PAGEDATTN_ENABLE_X64=OFF), its tests at reduced sizes;
#   6. 60 s of the libFuzzer target over both primitives (tests/fuzz/run.sh, clang, ASan + UBSan).
# Stops at the first failing stage.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install_dependencies.sh
jobs=$(nproc)

# Runs ctest in a build tree and prints how many tests ran and how long they took.
run_ctest() {
  local dir=$1 label=$2
  shift 2
  local count start
  count=$(ctest --test-dir "$dir" -N "$@" | sed -n 's/^Total Tests: //p')
  start=$(date +%s)
  ctest --test-dir "$dir" --output-on-failure -j2 "$@"
  echo "== $label: ${count:-?} tests passed in $(( $(date +%s) - start )) s"
}

echo "== release build (build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$jobs"
run_ctest build release

echo "== AMX emulator build (build-amx-emulator/, x64:amx on emulated tiles)"
cmake -S . -B build-amx-emulator -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGEDATTN_AMX_EMULATOR=ON \
  -DPAGEDATTN_BUILD_EXAMPLES=OFF -DPAGEDATTN_BUILD_BENCHMARKS=OFF
cmake --build build-amx-emulator -j "$jobs"
run_ctest build-amx-emulator amx-emulator

echo "== sanitizer build (build-sanitize/, clang, ASan + UBSan, AMX emulator)"
# -O1 -g without NDEBUG: faster to build than -O2, and assertions stay on.
cmake -S . -B build-sanitize -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DPAGEDATTN_BUILD_EXAMPLES=OFF \
  -DPAGEDATTN_BUILD_BENCHMARKS=OFF -DPAGEDATTN_AMX_EMULATOR=ON
cmake --build build-sanitize -j "$jobs"
PAGEDATTN_TEST_REDUCED=1 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  run_ctest build-sanitize sanitizer -LE install

echo "== ThreadSanitizer build (build-tsan/, clang, the concurrency suites)"
# Concurrent executes from std::threads, inside a task_arena and as TBB tasks; library and user
# scratchpads; with and without a plan; both primitives. Debian's libtbb is not instrumented:
# src/parallel.hpp and tests/tbb_calls.hpp keep TBB's templates out of TSan's sight and state
# TBB's happens-before edges instead; tests/tsan.supp says what else is suppressed, and why.
cmake -S . -B build-tsan -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DPAGEDATTN_BUILD_EXAMPLES=OFF -DPAGEDATTN_BUILD_BENCHMARKS=OFF -DPAGEDATTN_AMX_EMULATOR=ON
cmake --build build-tsan -j "$jobs" --target concurrency_test threads_test scratch_test
PAGEDATTN_TEST_REDUCED=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp" \
  run_ctest build-tsan tsan -L concurrency

echo "== portable build (build-portable/, PAGEDATTN_ENABLE_X64=OFF: the reference only, as on non-x86)"
# Proves the library builds and is correct without any x86 kernel file; every suite, reduced.
cmake -S . -B build-portable -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGEDATTN_ENABLE_X64=OFF \
  -DPAGEDATTN_BUILD_EXAMPLES=OFF -DPAGEDATTN_BUILD_BENCHMARKS=OFF
cmake --build build-portable -j "$jobs"
# Everything but the test that a fast implementation is chosen (there is none in this build).
PAGEDATTN_TEST_REDUCED=1 run_ctest build-portable portable -E 'selection|env_cap' -LE install

echo "== fuzzing (build-fuzz/, libFuzzer + ASan + UBSan, 60 s on tests/fuzz/corpus)"
start=$(date +%s)
tests/fuzz/run.sh 60
echo "== fuzz: no crash, sanitizer report or partial write in $(( $(date +%s) - start )) s"
