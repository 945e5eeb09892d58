#!/usr/bin/env bash
# Builds tests/fuzz/primitives_fuzzer with clang (libFuzzer + ASan + UBSan, the library instrumented
# too) in build-fuzz/ and runs it for SECONDS (default 60) on a copy of the seed corpus
# tests/fuzz/corpus/ (new inputs go to build-fuzz/corpus/, the repository's corpus is left as it is).
#   tests/fuzz/run.sh [SECONDS] [extra libFuzzer flags...]
# A crash, a sanitizer report, a leak or a partial write (the fuzzer aborts) fails the run; the input
# that caused it is left in build-fuzz/ (crash-*), and can be replayed: build-fuzz/primitives_fuzzer FILE.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
seconds=${1:-60}
shift || true
cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DPAGEDATTN_BUILD_TESTS=OFF -DPAGEDATTN_BUILD_EXAMPLES=OFF \
  -DPAGEDATTN_BUILD_BENCHMARKS=OFF -DPAGEDATTN_BUILD_FUZZERS=ON -DPAGEDATTN_AMX_EMULATOR=ON >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target primitives_fuzzer
mkdir -p build-fuzz/corpus
cp -n tests/fuzz/corpus/* build-fuzz/corpus/ 2>/dev/null || true
cd build-fuzz
set +e
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ./primitives_fuzzer -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
  "$@" corpus >fuzz.log 2>&1
status=$?
set -e
# The log without libFuzzer's progress lines: the start, any report, the final statistics.
grep -vE '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse|RELOAD)' fuzz.log | tail -n 60
exit "$status"
