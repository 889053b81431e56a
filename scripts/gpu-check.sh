#!/usr/bin/env bash
# Builds what the GPU host runs and packs it into .device/payload.tar.xz (see GPU.md):
# the release GPU test binaries (tests/cuda*.rs, tests/gpu_profile.rs; tests/dist_gpu.rs
# into .device/nccl/) and the asrforge binary,
# with the CUDA kernels embedded, stripped, plus the configs they read.
# The GPU host has no Rust and no network: scripts/gpu-run.sh runs them.
#
#   NVCC=/path/to/nvcc [CUDA_ARCHS=80,90] scripts/gpu-check.sh
#
# Without NVCC set it looks for nvcc on PATH and in the cache folder that
# scripts/install-nvcc.sh installs into. Fails when nothing is staged, when
# a binary lacks the kernels, or when the packed payload exceeds 60 MiB
# (what travels to the GPU host is at most 64 MiB with the tree). The
# binaries are staged in target/device-stage/ first: about 190 MiB stripped,
# mostly the same embedded kernels and library code in each, which xz with a
# dictionary larger than the whole shrinks to a few MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEV=$ROOT/target/device-stage
PAYLOAD=$ROOT/.device/payload.tar.xz
LIMIT_MIB=60

if [ -z "${NVCC:-}" ]; then
    if command -v nvcc >/dev/null 2>&1; then
        NVCC=$(command -v nvcc)
    else
        NVCC=$(find "${XDG_CACHE_HOME:-$HOME/.cache}/asrforge" -path '*/bin/nvcc' -type f 2>/dev/null | sort | tail -1 || true)
    fi
fi
if [ -z "${NVCC:-}" ] || [ ! -x "$NVCC" ]; then
    echo "gpu-check: no nvcc found (set NVCC, or run scripts/install-nvcc.sh)" >&2
    exit 1
fi
export NVCC
echo "gpu-check: nvcc $NVCC ($("$NVCC" --version | tail -1))"

# The ignored folder, never committed.
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")"
grep -qxF '/.device/' "$EXCLUDE" 2>/dev/null || echo '/.device/' >> "$EXCLUDE"

echo "gpu-check: building test binaries (release, --features cuda)"
cargo test --release --features cuda --no-run --message-format=json > "$ROOT/target/gpu-check-tests.json"
cargo build --release --features cuda --bin asrforge
cargo bench --features cuda --bench gpu_kernels --bench optim --no-run --message-format=json > "$ROOT/target/gpu-check-benches.json"

rm -rf "$DEV"
mkdir -p "$DEV/tests" "$DEV/bin"
# Test executables: the GPU suites (target name cuda*, gpu_profile, and kernel_lab: a lab
# variant is checked there before its bench is read), named by their target.
python3 - "$ROOT/target/gpu-check-tests.json" "$DEV/tests" <<'PY'
import json, os, shutil, sys
src, dst = sys.argv[1], sys.argv[2]
staged = []
for line in open(src):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t = m["target"]
    # cuda_emu is the emulator's own suite (it sets ASRFORGE_CUDA_EMU and
    # needs the build tree's emulated modules): nothing in it is for a GPU.
    if "test" in t["kind"] and t["name"] != "cuda_emu" and (t["name"].startswith("cuda") or t["name"] in ("gpu_profile", "kernel_lab")):
        shutil.copy(m["executable"], f"{dst}/{t['name']}")
        staged.append(t["name"])
    elif "test" in t["kind"] and t["name"] == "dist_gpu":
        # The NCCL and GPU-engine tests: gpu-run.sh's NCCL section runs
        # chosen tests of it (not the generic loop: its launcher tests need
        # the build tree).
        os.makedirs(f"{dst}/../nccl", exist_ok=True)
        shutil.copy(m["executable"], f"{dst}/../nccl/dist_gpu")
        staged.append("nccl/dist_gpu")
print("gpu-check: staged tests:", " ".join(sorted(staged)) or "(none)")
sys.exit(0 if staged else 1)
PY
cp target/release/asrforge "$DEV/bin/asrforge"
# The GPU benches (criterion): the kernels' and the optimizer step's; their timings mean something there.
mkdir -p "$DEV/benches"
python3 - "$ROOT/target/gpu-check-benches.json" "$DEV/benches" <<'PY'
import json, shutil, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("gpu_kernels", "optim"):
        shutil.copy(m["executable"], f"{sys.argv[2]}/{m['target']['name']}")
PY
strip "$DEV"/benches/*
strip "$DEV"/tests/* "$DEV/bin/asrforge"
[ -f "$DEV/nccl/dist_gpu" ] && strip "$DEV/nccl/dist_gpu"
# What the binaries read: the configs (bench-train uses the AISHELL one).
cp -r conf "$DEV/conf"
# The kernel sources: the staged build test (tests/cuda_build.rs) compares
# the embedded modules with them, as the build tree's path is not there.
mkdir -p "$DEV/cuda"
cp cuda/*.cu "$DEV/cuda/"
cp scripts/gpu-run.sh scripts/bench_pytorch_ref.py scripts/bench_sdpa_ref.py "$DEV/"

# The kernels must be embedded, or the GPU host can only report that:
# the staged build test compares the embedded modules with cuda/*.cu.
if ! CI=1 "$DEV/tests/cuda_build" every_kernel_file_is_embedded_in_ci --nocapture > "$DEV/kernels.txt" 2>&1; then
    echo "gpu-check: not every cuda/*.cu is embedded:" >&2
    cat "$DEV/kernels.txt" >&2
    exit 1
fi
grep -E '^(cuda/|embedded)' "$DEV/kernels.txt" | sed 's/^/gpu-check: /'

SIZE=$(du -sk "$DEV" | cut -f1)
echo "gpu-check: staged $(find "$DEV" -type f | wc -l) files, $((SIZE / 1024)) MiB ($SIZE KiB)"
du -sh "$DEV"/tests/* "$DEV"/bin/* | sed 's/^/  /'
rm -rf "$ROOT/.device"
mkdir -p "$ROOT/.device"
tar cf - -C "$DEV" . | xz -T2 -6 --lzma2=dict=256MiB > "$PAYLOAD"
PSIZE=$(du -sk "$PAYLOAD" | cut -f1)
echo "gpu-check: packed into .device/payload.tar.xz, $((PSIZE / 1024)) MiB ($PSIZE KiB)"
if [ "$PSIZE" -gt $((LIMIT_MIB * 1024)) ]; then
    echo "gpu-check: the payload exceeds $LIMIT_MIB MiB" >&2
    exit 1
fi
echo "gpu-check: ready; on the GPU host run: bash scripts/gpu-run.sh (with .device carried)"
