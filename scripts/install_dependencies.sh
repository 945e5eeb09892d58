#!/usr/bin/env bash
# Installs what pagedattn needs to build and test, from Debian 12's own archive (nothing is downloaded
# from anywhere else). Does nothing, and needs no network, when everything is already installed.
set -euo pipefail

packages=(
  cmake ninja-build g++          # build
  clang libclang-rt-14-dev       # the sanitizer build (clang 14's ASan/UBSan runtimes are a separate package)
  libdnnl-dev ocl-icd-opencl-dev # oneDNN engine/stream; its CMake package needs OpenCL
  libtbb-dev                     # oneTBB, all of the library's parallelism
  libgtest-dev                   # the tests
)

missing=()
for p in "${packages[@]}"; do
  if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_dependencies: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install_dependencies: run as root or install sudo" >&2; exit 1; }
  sudo=(sudo)
fi
echo "install_dependencies: installing ${missing[*]}"
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
