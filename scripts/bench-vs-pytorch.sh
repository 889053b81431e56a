#!/usr/bin/env bash
# asrforge's CPU training step side by side with a PyTorch reference of the
# same model, in one command: forward + backward + Adam + gradient clipping
# on the same batch shapes (the same ragged lengths), the same thread count,
# RUNS interleaved runs of each, and the medians of their median step times.
# Prints a table: ms/step (median of runs; min..max of the runs' medians),
# the ratio asrforge/PyTorch, and peak RSS of each process.
#
# PyTorch (CPU) is installed from PyPI into a venv under ~/.cache/asrforge
# (kept out of the repository); the reference model is
# scripts/bench_pytorch_ref.py, written for this comparison, which asserts it
# has asrforge's parameter count.
#
#   scripts/bench-vs-pytorch.sh                  # both configs of issue 17
#   CONFIGS=small RUNS=3 scripts/bench-vs-pytorch.sh
#
# Environment: THREADS (2), RUNS (5), STEPS per run (4: 1 warm-up + 3 timed),
# CONFIGS ("small aishell"), TORCH_VERSION (2.15.0), BIN (target/release/asrforge).
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-2}
RUNS=${RUNS:-5}
STEPS=${STEPS:-4}
CONFIGS=${CONFIGS:-small aishell}
TORCH_VERSION=${TORCH_VERSION:-2.15.0}
VENV=${VENV:-$HOME/.cache/asrforge/torch-venv}
BIN=${BIN:-target/release/asrforge}

if ! "$VENV/bin/python" -c "import torch, yaml" 2>/dev/null; then
    echo "installing torch $TORCH_VERSION into $VENV (once)" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" pyyaml >&2
fi
if [ ! -x "$BIN" ]; then
    cargo build --release --bin asrforge >&2
fi

# name | config | overrides (KEY VALUE;...) | batch | frames
small_cfg="conf/tiny.yaml|encoder_conf.output_size 144;encoder_conf.linear_units 576;encoder_conf.num_blocks 4;encoder_conf.cnn_module_kernel 15;decoder_conf.linear_units 576;decoder_conf.num_blocks 2|16|300"
# The AISHELL recipe without its global CMVN file (not in the repository; a per-frame affine map costs nothing here).
AISHELL_YAML=$(mktemp --suffix=.yaml)
trap 'rm -f "$AISHELL_YAML"' EXIT
sed '/^cmvn:/,/^$/d' conf/train_conformer.yaml > "$AISHELL_YAML"
aishell_cfg="$AISHELL_YAML||8|500"

echo "bench-vs-pytorch: $(date -u +%FT%TZ), threads $THREADS, $RUNS interleaved runs of $STEPS steps (1 warm-up), load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for name in $CONFIGS; do
    spec_var="${name}_cfg"
    IFS='|' read -r cfg ovr batch frames <<<"${!spec_var}"
    af_args=(bench-train --config "$cfg" --steps "$STEPS" --warmup 1 --batch_size "$batch" --frames "$frames")
    py_args=(scripts/bench_pytorch_ref.py --config "$cfg" --steps "$STEPS" --warmup 1 --batch_size "$batch" --frames "$frames" --threads "$THREADS")
    IFS=';' read -ra ovs <<<"$ovr"
    for o in "${ovs[@]}"; do
        [ -n "$o" ] && af_args+=(--override_config "$o") && py_args+=(--override "$o")
    done
    "$VENV/bin/python" - "$name" "$RUNS" "$THREADS" "$BIN" "$VENV/bin/python" "${#af_args[@]}" "${af_args[@]}" "${py_args[@]}" <<'PY'
import os, re, statistics, subprocess, sys
name, runs, threads, binary, py, n_af = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
af_args, py_args = sys.argv[7:7 + n_af], sys.argv[7 + n_af:]
env = dict(os.environ, RAYON_NUM_THREADS=threads, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)

def run(cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    if status != 0:
        sys.exit(f"{cmd[:2]} failed with status {status}")
    line = [l for l in out.splitlines() if l.startswith(("bench-train", "pytorch"))][-1]
    f = dict(w.split("=", 1) for w in line.split()[1:] if "=" in w)
    return float(f["step_ms_median"]), ru.ru_maxrss / 1024.0, f

af, pt = [], []
params = None
for r in range(runs):
    a = run([binary] + af_args)
    params = a[2]["params"]
    af.append(a)
    pt.append(run([py] + py_args + ["--params", params]))
    print(f"  {name} run {r + 1}: asrforge {a[0]:.0f} ms, pytorch {pt[-1][0]:.0f} ms (load {open('/proc/loadavg').read().split()[0]})", file=sys.stderr)
m_af, m_pt = statistics.median(x[0] for x in af), statistics.median(x[0] for x in pt)
rss_af, rss_pt = max(x[1] for x in af), max(x[1] for x in pt)
print(f"{name}: params {params}, {pt[0][2].get('torch', '?')}")
print(f"  {'':<10} {'ms/step':>9} {'runs min..max':>15} {'peak RSS MiB':>13}")
print(f"  {'pytorch':<10} {m_pt:>9.0f} {min(x[0] for x in pt):>7.0f}..{max(x[0] for x in pt):<7.0f} {rss_pt:>13.0f}")
print(f"  {'asrforge':<10} {m_af:>9.0f} {min(x[0] for x in af):>7.0f}..{max(x[0] for x in af):<7.0f} {rss_af:>13.0f}")
print(f"  ratio asrforge/pytorch: time {m_af / m_pt:.2f}, peak RSS {rss_af / rss_pt:.2f}")
PY
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
