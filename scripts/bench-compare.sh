#!/usr/bin/env bash
# The perf-regression workflow: save a criterion baseline, change a kernel,
# compare a new run against the baseline. Prints every bench whose mean moved
# beyond its noise band and exits 1 when one got slower past the threshold.
#
#   scripts/bench-compare.sh save NAME [cargo bench args] [-- criterion args]
#   scripts/bench-compare.sh compare NAME [options] [cargo bench args] [-- criterion args]
#   scripts/bench-compare.sh diff BASE NEW [options]           # two saved baselines, no run
#
# options (compare and diff):
#   --threshold PCT   a slowdown past PCT % is a regression (default 5)
#   --noise PCT       the smallest change reported, whatever the intervals (default 2)
#   --dir DIR         criterion's output (default $CARGO_TARGET_DIR/criterion or target/criterion)
#
# A bench "moved" when |new/base - 1| exceeds its noise band: the larger of
# --noise and the sum of the relative half-widths of the two 95 % confidence
# intervals of the mean that criterion wrote (estimates.json). A regression
# is a move that is slower by more than --threshold. `compare` runs
# `cargo bench ARGS -- --save-baseline NAME.new` and then `diff NAME NAME.new`.
# Example: scripts/bench-compare.sh save before --bench gpu_kernels -- layer_norm
# Exit status: 0 no regression, 1 regression, 2 usage error or nothing to compare.
#
# On a machine without a GPU the GPU benches run on the emulator (set
# ASRFORGE_CUDA_EMU=1) and their timings say nothing about a GPU: compare
# GPU kernels on the GPU host (GPU.md).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1; shift

threshold=5 noise=2 dir="${CARGO_TARGET_DIR:-target}/criterion"
parse_opts() {
    rest=() crit=()
    while [ $# -gt 0 ]; do
        case "$1" in
            --) shift; crit=("$@"); break ;;
            --threshold) threshold=${2:?--threshold needs a percentage}; shift 2 ;;
            --noise) noise=${2:?--noise needs a percentage}; shift 2 ;;
            --dir) dir=${2:?--dir needs a directory}; shift 2 ;;
            *) rest+=("$1"); shift ;;
        esac
    done
}

diff_baselines() { # BASE NEW
    python3 - "$dir" "$1" "$2" "$threshold" "$noise" <<'PY'
import json, os, sys

root, base, new, threshold, noise = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
if not os.path.isdir(root):
    print(f"bench-compare: no criterion output at {root} (run `save` first, or pass --dir)", file=sys.stderr)
    sys.exit(2)

def mean(path):
    with open(path) as f:
        m = json.load(f)["mean"]
    ci = m["confidence_interval"]
    return m["point_estimate"], ci["lower_bound"], ci["upper_bound"]

def name_of(d, leaf):
    try:
        with open(os.path.join(d, leaf, "benchmark.json")) as f:
            return json.load(f)["full_id"]
    except (OSError, KeyError, ValueError):
        return os.path.relpath(d, root)

rows, missing = [], []
for d, subdirs, _ in os.walk(root):
    has_base = os.path.isfile(os.path.join(d, base, "estimates.json"))
    has_new = os.path.isfile(os.path.join(d, new, "estimates.json"))
    if has_base and has_new:
        b, blo, bhi = mean(os.path.join(d, base, "estimates.json"))
        n, nlo, nhi = mean(os.path.join(d, new, "estimates.json"))
        if b <= 0 or n <= 0:
            continue
        change = n / b - 1.0
        band = max(noise / 100.0, (bhi - blo) / (2 * b) + (nhi - nlo) / (2 * n))
        rows.append((name_of(d, new), b, n, change, band))
    elif has_base != has_new:
        missing.append((name_of(d, base if has_base else new), base if has_new else new))

if not rows:
    print(f"bench-compare: no bench under {root} has both baselines {base!r} and {new!r}", file=sys.stderr)
    sys.exit(2)

def fmt(ns):
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3f} {unit}"
    return f"{ns:.1f} ns"

moved = sorted((r for r in rows if abs(r[3]) > r[4]), key=lambda r: -r[3])
regressed = [r for r in moved if r[3] * 100 > threshold]
print(f"{len(rows)} benches compared ({base} -> {new}); {len(moved)} moved beyond their noise band; threshold {threshold:g} %")
if moved:
    print(f"{'bench':60} {'base':>12} {'new':>12} {'change':>9} {'band':>7}  verdict")
    for name, b, n, change, band in moved:
        verdict = "REGRESSION" if change * 100 > threshold else ("slower" if change > 0 else "faster")
        print(f"{name:60} {fmt(b):>12} {fmt(n):>12} {change * 100:+8.1f}% {band * 100:6.1f}%  {verdict}")
for name, which in missing:
    print(f"note: {name} has no {which!r} result (added or removed bench)")
if regressed:
    print(f"bench-compare: {len(regressed)} regression(s) past {threshold:g} %", file=sys.stderr)
    sys.exit(1)
PY
}

case "$cmd" in
    save)
        name=$1; shift
        parse_opts "$@"
        cargo bench "${rest[@]}" -- "${crit[@]}" --save-baseline "$name"
        echo "bench-compare: saved baseline $name under $dir"
        ;;
    compare)
        name=$1; shift
        parse_opts "$@"
        cargo bench "${rest[@]}" -- "${crit[@]}" --save-baseline "$name.new"
        diff_baselines "$name" "$name.new"
        ;;
    diff)
        [ $# -ge 2 ] || usage
        base=$1 new=$2; shift 2
        parse_opts "$@"
        [ ${#rest[@]} -eq 0 ] && [ ${#crit[@]} -eq 0 ] || { echo "bench-compare: diff takes no cargo arguments, found: ${rest[*]}" >&2; exit 2; }
        diff_baselines "$base" "$new"
        ;;
    *) usage ;;
esac
