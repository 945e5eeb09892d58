#!/usr/bin/env bash
# The main job in one command: installs the dependencies, builds Release into build/ and runs the
# decode demo (bf16 vs FP8 KV cache). Extra arguments go to the demo (try --help).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install_dependencies.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)" --target decode_demo
build/examples/decode_demo "$@"
