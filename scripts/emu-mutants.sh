#!/usr/bin/env bash
# Shows that the GPU suites on the emulated device catch kernel bugs: each
# mutant is a deliberate bug applied to a copy of cuda/ (the tree is never
# touched); the modules that include the changed file are rebuilt from the
# copy with the flags build.rs uses, next to the unchanged modules, and the
# suites run on them through ASRFORGE_EMU_DIR under the ascending and the
# random thread order. Every mutant must make the suites fail; then the
# unchanged modules must pass. Prints one line per run and a verdict.
#
#   scripts/emu-mutants.sh            (after a release build of the GPU suites)
#
# Mutants:
#   barrier   block_reduce (common.cuh) loses the barrier between writing the
#             warps' partials and reading them
#   past-row  softmax writes one element past the end of its row
#   swapped   reduce.cu's sum_cols kernel takes (n, outer) where the host passes (outer, n)
#   ln-read   layer norm's first row loop (the forward's output loop; its
#             statistics are row_reduce's) reads and writes one element past the row
#   dyn-shared  (Rust side) sum_rows's launch asks for 8 bytes of dynamic
#             shared memory where its block reduction keeps one partial per warp:
#             applied to a copy of the whole tree, whose test binaries are
#             built in their own target dir ($EMU_MUTANTS_TARGET, default
#             /tmp/asrforge-emu-mutants-target, seeded once from ./target so
#             only the crate rebuilds) and run on the unchanged modules.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export CARGO_PROFILE_RELEASE_INCREMENTAL=${CARGO_PROFILE_RELEASE_INCREMENTAL:-true}

# The GPU suites' test binaries (built once; the kernels are loaded at run time).
SUITES=(cuda_ops cuda_ops_nn cuda_ops_loss ops_grad)
# Builds the suites in the current folder and prints their executables.
build_suites() {
    local json
    json=$(mktemp)
    cargo test --release --no-run --message-format=json $(printf -- '--test %s ' "${SUITES[@]}") > "$json" || { rm -f "$json"; return 1; }
    python3 -c '
import json, sys
for line in open(sys.argv[1]):
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in m["target"]["kind"]:
        print(m["executable"])' "$json"
    rm -f "$json"
}
mapfile -t BINS < <(build_suites)
[ ${#BINS[@]} -eq ${#SUITES[@]} ] || { echo "emu-mutants: expected ${#SUITES[@]} test binaries, found ${#BINS[@]}" >&2; exit 1; }

# The emulated modules of this build (build.rs's $OUT_DIR/emu).
EMU=$(ls -dt "$ROOT"/target/release/build/asrforge-*/out/emu 2>/dev/null | while read -r d; do [ -f "$d/rt_runtime.o" ] && echo "$d"; done | head -1)
[ -n "$EMU" ] || { echo "emu-mutants: no emulated modules under target/release/build (is g++ >= 12 installed?)" >&2; exit 1; }
CXX=${CXX:-g++}
FLAGS=(-std=c++17 -O2 -fPIC -fvisibility=hidden -fno-extern-tls-init -ffp-contract=off -fno-math-errno -w)
WORK=$(mktemp -d /tmp/asrforge-mutants.XXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT

# Rebuilds, from the mutated copy $1/cuda, every module whose preprocessed
# source includes a changed file, into $1/emu (the others are linked from $EMU).
build_mutant() {
    local m=$1 changed=$2
    mkdir -p "$m/emu"
    for so in "$EMU"/lib*.so; do ln -sf "$so" "$m/emu/"; done
    for cu in "$m"/cuda/*.cu; do
        local stem
        stem=$(basename "$cu" .cu)
        if [ "$changed" != "$stem.cu" ] && ! grep -q "#include \"$changed\"" "$cu" && ! { [ "$changed" = common.cuh ] && grep -q '#include "nn_common.cuh"' "$cu"; }; then
            continue
        fi
        sed "s|#include \"$ROOT/cuda/$stem.cu\"|#include \"$cu\"|" "$EMU/${stem}_emu.cpp" > "$m/emu/${stem}_emu.cpp"
        grep -q "#include \"$cu\"" "$m/emu/${stem}_emu.cpp" || { echo "emu-mutants: cannot point the table of $stem at the copy" >&2; return 1; }
        "$CXX" "${FLAGS[@]}" -I"$ROOT/cuda/emu" -x c++ -include "$ROOT/cuda/emu/emu.h" -I"$m/cuda" -I"$ROOT/cuda/emu/include" \
            -c -o "$m/emu/$stem.o" "$m/emu/${stem}_emu.cpp" || return 1
        rm -f "$m/emu/lib$stem.so"
        "$CXX" -shared -fPIC -o "$m/emu/lib$stem.so" "$m/emu/$stem.o" "$EMU"/rt_*.o -ldl -lpthread || return 1
        echo "  rebuilt $stem from the mutated copy"
    done
}

# Runs every suite on the emulated device with modules from $1 under order $2;
# prints a summary and returns 0 only if all pass.
# The test binaries are $BINS, or those named in $RUN_BINS (space separated).
run_suites() {
    local dir=$1 sched=$2 log=$3 ok=0 bins
    read -ra bins <<< "${RUN_BINS:-${BINS[*]}}"
    : > "$log"
    for b in "${bins[@]}"; do
        if ! env ASRFORGE_CUDA_EMU=1 ASRFORGE_EMU_DIR="$dir" ASRFORGE_EMU_SCHEDULE="$sched" ASRFORGE_EMU_SEED=${ASRFORGE_EMU_SEED:-7} \
            timeout 900 "$b" --test-threads=2 >> "$log" 2>&1; then
            ok=1
        fi
    done
    local failed
    failed=$(grep -cE '^test .* FAILED$' "$log")
    echo "    $sched: $(grep -E '^test result:' "$log" | awk '{p+=$4; f+=$6} END {print p" passed, "f" failed"}') ($failed failing tests; first: $(grep -m1 -E '^test .* FAILED$' "$log" | sed 's/^test //; s/ \.\.\. FAILED//'))"
    return $ok
}

mutate() {
    local name=$1 m=$WORK/$1
    mkdir -p "$m"
    cp -r cuda "$m/cuda"
    case $name in
        barrier)
            python3 - "$m/cuda/common.cuh" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
old = "        if (lane == 0) smem[warp] = v;\n        __syncthreads();\n"
assert old in s, "block_reduce's barrier after the warp partials not found"
open(p, "w").write(s.replace(old, "        if (lane == 0) smem[warp] = v;\n"))
PY
            echo common.cuh ;;
        past-row)
            python3 - "$m/cuda/softmax.cu" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
old = "for (uint32_t i = G::t(); i < n; i += G::size()) yr[i] = Num<T>::from(nn_exp("
assert old in s, "softmax's write loop not found"
open(p, "w").write(s.replace(old, "for (uint32_t i = G::t(); i <= n; i += G::size()) yr[i] = Num<T>::from(nn_exp("))
PY
            echo softmax.cu ;;
        swapped)
            python3 - "$m/cuda/reduce.cu" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
old = 'extern "C" __global__ void sum_cols_##dt(const T* x, T* y, i64 outer, i64 n, i64 inner)'
assert old in s, "sum_cols's signature not found"
open(p, "w").write(s.replace(old, 'extern "C" __global__ void sum_cols_##dt(const T* x, T* y, i64 n, i64 outer, i64 inner)'))
PY
            echo reduce.cu ;;
        ln-read)
            python3 - "$m/cuda/norm.cuh" <<'PY'
import sys, re
p = sys.argv[1]; s = open(p).read()
# The first row loop of layer norm (its forward's output): one element more.
m = re.search(r"for \((?:i64|uint32_t|int) (\w+) = (?:threadIdx\.x|G::t\(\)); \1 < (\w+);", s)
assert m, "norm.cuh's first row loop not found"
open(p, "w").write(s[:m.start()] + m.group(0).replace(" < ", " <= ") + s[m.end():])
PY
            echo norm.cuh ;;
    esac
}

STATUS=0
echo "emu-mutants: modules of $EMU; suites: ${SUITES[*]}"
for name in barrier past-row swapped ln-read; do
    echo "mutant $name:"
    changed=$(mutate "$name") || { echo "  could not apply"; STATUS=1; continue; }
    build_mutant "$WORK/$name" "$changed" || { echo "  could not build"; STATUS=1; continue; }
    caught=0
    for sched in asc random; do
        run_suites "$WORK/$name/emu" "$sched" "$WORK/$name-$sched.log" || caught=1
    done
    if [ $caught -eq 1 ]; then echo "  CAUGHT"; else echo "  NOT CAUGHT: the suites passed with the bug"; STATUS=1; fi
done
# The Rust-side mutant: a copy of the tree with the launch configuration changed.
echo "mutant dyn-shared (Rust side):"
RT=$WORK/dyn-shared-tree
mkdir -p "$RT"
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -x -C "$RT"
if python3 - "$RT/src/backend/cuda/reduce.rs" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
old = "const ROW_SHARED_BYTES: u32 = 32 * 8;"
assert s.count(old) == 1, "sum_rows's shared bytes not found"
open(p, "w").write(s.replace(old, "const ROW_SHARED_BYTES: u32 = 8;"))
PY
then
    export_target=${EMU_MUTANTS_TARGET:-/tmp/asrforge-emu-mutants-target}
    [ -d "$export_target" ] || cp -a "$ROOT/target" "$export_target"
    mapfile -t RBINS < <(cd "$RT" && CARGO_TARGET_DIR=$export_target build_suites)
    if [ ${#RBINS[@]} -eq ${#SUITES[@]} ]; then
        caught=0
        for sched in asc random; do
            RUN_BINS="${RBINS[*]}" run_suites "$EMU" "$sched" "$WORK/dyn-shared-$sched.log" || caught=1
        done
        if [ $caught -eq 1 ]; then echo "  CAUGHT"; else echo "  NOT CAUGHT: the suites passed with the bug"; STATUS=1; fi
    else
        echo "  could not build"; STATUS=1
    fi
else
    echo "  could not apply"; STATUS=1
fi
echo "unchanged tree:"
clean=0
for sched in asc random; do
    run_suites "$EMU" "$sched" "$WORK/clean-$sched.log" || clean=1
done
if [ $clean -eq 0 ]; then echo "  PASS"; else echo "  FAIL on the unchanged tree"; grep -E 'panicked|FAILED' "$WORK"/clean-*.log | head -10; STATUS=1; fi
[ $STATUS -eq 0 ] && echo "emu-mutants: every mutant caught, the unchanged tree passes" || echo "emu-mutants: FAILED"
exit $STATUS
