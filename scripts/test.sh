#!/usr/bin/env bash
# The test command: installs nvcc (scripts/install-nvcc.sh) so every CUDA
# kernel is compiled, then runs the whole test suite. GPU tests skip with a
# printed reason where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --check || { echo "cargo fmt --check failed: run cargo fmt" >&2; exit 1; }
eval "$(scripts/install-nvcc.sh | tail -n1)"
echo "using NVCC=$NVCC" >&2
cargo test --release "$@"
