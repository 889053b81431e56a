#!/usr/bin/env bash
# Runs the staged GPU check on a GPU host with no Rust and no network (see
# GPU.md), from the repository root, after scripts/gpu-check.sh staged
# .device/ on a build machine:
#   1. puts the CUDA libraries of the host's Python packages on LD_LIBRARY_PATH
#      (with a libnccl.so symlink: pip ships only libnccl.so.2);
#   2. runs every staged GPU test binary with outputs poisoned
#      (ASRFORGE_CUDA_POISON=1);
#   3. trains the AISHELL conformer config 50 steps on synthetic features in
#      f32, f32 with TF32 products (--tf32), fp16-AMP and bf16 on the GPU, and
#      computes the same model's initial loss on the CPU for each, to compare;
#      a throughput table per dtype: frames/s, step time, peak memory and the
#      seam's per-step counters;
#   4. the step profile (bench-train --profile) in bf16 and fp32: per kernel
#      family launches, bytes, GEMM FLOPs, the modelled H200 time and the time
#      CUDA events measured;
#   4b. the whole step with the fused kernels against the compositions
#      (ASRFORGE_FUSION=all vs none) in fp16 and bf16: frames/s, peak, launches;
#   5. NCCL (tests/dist_gpu.rs, staged in .device/nccl/): a world-size-1 NCCL
#      communicator (init, every collective on f32/f16/bf16 against expected
#      values, destroy), DDP and ZeRO-2 over NCCL at world size 1 equal to one
#      process after 20 steps, and DDP/ZeRO-1/2 on the GPU at 2 processes over
#      gloo; one GPU exercises world size 1 of NCCL only (no link is measured);
#   6. prints the tables last. Full logs go to $OUT when it is set.
# Each piece has its own timeout so the whole stays under 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d .device ] || cd ..   # also runs as .device/gpu-run.sh
DEV=$PWD/.device
LOG=${OUT:-/tmp/asrforge-gpu-run}
mkdir -p "$LOG"
START=$(date +%s)
BIN=$DEV/bin/asrforge
STEPS=${STEPS:-50}
BATCH=${BATCH:-16}
FRAMES=${FRAMES:-512}
CONFIG=${CONFIG:-$DEV/conf/train_conformer.yaml}
# 50 steps of WarmupLR(25000) barely move the weights; a short warm-up shows learning.
OVERRIDES=(--override_config "scheduler_conf.warmup_steps 10")

# --- 1. libraries -----------------------------------------------------------
LIBDIR=$(mktemp -d /tmp/asrforge-libs.XXXX)
SEARCH=$(python3 -c 'import site,sys; print(" ".join(site.getsitepackages()+[site.getusersitepackages()]))' 2>/dev/null)
find_lib() {
    local f=""
    for d in $SEARCH /usr/local/cuda /usr/lib /usr/lib64 /usr/local/lib; do
        [ -d "$d" ] || continue
        f=$(find "$d" -name "$1" 2>/dev/null | head -1)
        [ -n "$f" ] && break
    done
    [ -z "$f" ] && f=$(timeout 60 find / -xdev -name "$1" 2>/dev/null | head -1)
    echo "$f"
}
for l in libcublas.so.13 libcublasLt.so.13 libnvrtc.so.13 libcurand.so.10 libnccl.so.2; do
    f=$(find_lib "$l")
    if [ -n "$f" ]; then
        LD_LIBRARY_PATH=$(dirname "$f"):${LD_LIBRARY_PATH:-}
        echo "lib $l: $f"
        [ "$l" = libnccl.so.2 ] && ln -sf "$f" "$LIBDIR/libnccl.so"
    else
        echo "lib $l: not found"
    fi
done
export LD_LIBRARY_PATH=$LIBDIR:${LD_LIBRARY_PATH:-}
export ASRFORGE_CUDA_POISON=1
nvidia-smi > "$LOG/nvidia-smi.txt" 2>&1 || true
"$BIN" info > "$LOG/info.txt" 2>&1 || echo "asrforge info failed: $(tail -1 "$LOG/info.txt")"
cat "$LOG/info.txt"

# --- 2. GPU tests -----------------------------------------------------------
declare -a TROWS
for t in "$DEV"/tests/*; do
    name=$(basename "$t")
    if [ $(( $(date +%s) - START )) -gt 240 ]; then
        TROWS+=("$(printf '%-22s %s' "$name" 'NOT RUN (the tests used their 4 minutes)')")
        continue
    fi
    timeout 150 "$t" --test-threads=1 > "$LOG/test-$name.log" 2>&1
    rc=$?
    res=$(grep -E '^test result:' "$LOG/test-$name.log" | tail -1 | sed 's/^test result: //')
    skipped=$(grep -ci 'skipped' "$LOG/test-$name.log")
    [ $rc -eq 0 ] && st=ok || st="FAILED (rc $rc)"
    TROWS+=("$(printf '%-22s %-14s %s; %s lines say skipped' "$name" "$st" "${res:-no result line}" "$skipped")")
    echo "test $name: $st"
    [ $rc -ne 0 ] && grep -E 'panicked|FAILED|assert' "$LOG/test-$name.log" | head -5
done

# --- 3. training ------------------------------------------------------------
field() { grep -o "$1=[^ ]*" <<<"$2" | head -1 | cut -d= -f2; }
declare -a RROWS TPROWS
for dt in fp32 tf32 fp16 bf16; do
    # tf32: f32 training with TF32 tensor cores allowed for the products.
    if [ "$dt" = tf32 ]; then DTARGS=(--dtype fp32 --tf32); else DTARGS=(--dtype "$dt"); fi
    gpu=$(timeout 120 "$BIN" bench-train --config "$CONFIG" "${OVERRIDES[@]}" --steps "$STEPS" --device cuda "${DTARGS[@]}" \
        --batch_size "$BATCH" --frames "$FRAMES" 2> "$LOG/train-cuda-$dt.log" | grep '^bench-train' | tail -1)
    echo "cuda $dt: ${gpu:-failed (see $LOG/train-cuda-$dt.log: $(tail -1 "$LOG/train-cuda-$dt.log"))}"
    cpu=$(timeout 90 "$BIN" bench-train --config "$CONFIG" "${OVERRIDES[@]}" --steps 0 --device cpu --dtype "${DTARGS[1]}" \
        --batch_size "$BATCH" --frames "$FRAMES" 2> "$LOG/train-cpu-$dt.log" | grep '^bench-train' | tail -1)
    echo "cpu  $dt: ${cpu:-failed (see $LOG/train-cpu-$dt.log)}"
    echo "$gpu" >> "$LOG/bench-train.txt"
    echo "$cpu" >> "$LOG/bench-train.txt"
    RROWS+=("$(python3 - "$dt" "$gpu" "$cpu" <<'PY'
import sys
dt, gpu, cpu = sys.argv[1:4]
def f(line):
    return dict(w.split("=", 1) for w in line.split()[1:] if "=" in w)
g, c = f(gpu), f(cpu)
def num(d, k):
    try:
        return float(d[k])
    except (KeyError, ValueError):
        return float("nan")
gi, ci = num(g, "init_loss"), num(c, "init_loss")
rel = abs(gi - ci) / abs(ci) if ci == ci and ci != 0 else float("nan")
# f32 kernels vs the CPU: summation order only; TF32 and half types: products on rounded inputs.
tol = 1e-4 if dt == "fp32" else 2e-3
first, last = num(g, "first_loss"), num(g, "last_loss")
ok = "ok" if rel <= tol and last < first else "FAIL"
print(f"{dt:<5} {gi:>11.5f} {ci:>11.5f} {rel:>9.2e} {first:>10.4f} {last:>10.4f} {g.get('skipped','-'):>4} {num(g,'frames_per_s'):>10.0f} {num(g,'peak_mib'):>9.1f}  {ok} (tol {tol:g}, last<first)")
PY
)")
    TPROWS+=("$(python3 - "$dt" "$gpu" <<'PY'
import sys
dt, gpu = sys.argv[1:3]
head, _, steady = gpu.partition("per_step(")
g = dict(w.split("=", 1) for w in head.split()[1:] if "=" in w)
s = dict(w.split("=", 1) for w in steady.split() if "=" in w)
def get(d, k):
    return d.get(k, "-")
print(f"{dt:<5} {get(g,'frames_per_s'):>10} {get(g,'step_ms_median'):>9} {get(g,'peak_mib'):>9} {get(s,'launches'):>9} {get(s,'gemms'):>7} {get(s,'lt_heuristics'):>6} {get(s,'host_syncs'):>6} {get(s,'driver_allocs'):>7}")
PY
)")
done

# --- 4. step profile ------------------------------------------------------
# One steady-state step (the last of 3, after 2 warm-up steps) per dtype,
# timed per launch with CUDA events beside the model.
declare -a PROWS
for dt in bf16 fp32; do
    timeout 90 "$BIN" bench-train --config "$CONFIG" "${OVERRIDES[@]}" --steps 3 --warmup 2 --device cuda --dtype "$dt" \
        --batch_size "$BATCH" --frames "$FRAMES" --profile > "$LOG/profile-$dt.txt" 2> "$LOG/profile-$dt.log"
    rc=$?
    echo "profile $dt: rc $rc ($LOG/profile-$dt.txt)"
    # The kernel-family table: from its title to its total line, the 25 largest families kept.
    PROWS+=("== $dt (rc $rc) ==")
    while IFS= read -r line; do PROWS+=("$line"); done < <(
        sed -n '/^GPU step profile/,/^total /p' "$LOG/profile-$dt.txt" | awk 'NR<=4 || /^total / || n++ < 25')
done

# --- 5. NCCL -----------------------------------------------------------------
# ASRFORGE_REQUIRE_NCCL=1: a missing GPU or NCCL fails these tests instead of
# skipping them. World size 1 only: one GPU cannot exercise a link, a peer's
# failure or the overlap of communication with backward.
declare -a NROWS
NCCL_BIN=$DEV/nccl/dist_gpu
if [ ! -x "$NCCL_BIN" ]; then
    NROWS+=("not staged (.device/nccl/dist_gpu missing: rerun scripts/gpu-check.sh)")
else
    "$BIN" info 2>&1 | grep -i '^NCCL' | sed 's/^/info: /' > "$LOG/nccl-info.txt"
    for t in nccl_world_1_collectives_on_f32_f16_bf16 \
             nccl_ddp_and_zero2_at_world_1_match_one_process_after_20_steps \
             gpu_ddp_and_zero_equal_one_process_at_2_ranks; do
        if [ $(( $(date +%s) - START )) -gt 420 ]; then
            NROWS+=("$(printf '%-62s %s' "$t" 'NOT RUN (out of time)')")
            continue
        fi
        ASRFORGE_REQUIRE_NCCL=1 timeout 120 "$NCCL_BIN" "$t" --exact --nocapture --test-threads=1 > "$LOG/nccl-$t.log" 2>&1
        rc=$?
        [ $rc -eq 0 ] && st=ok || st="FAILED (rc $rc)"
        detail=$(grep -E 'NCCL (world size 1|ddp|zero2|[0-9])|skipped|REL ' "$LOG/nccl-$t.log" | tr '\n' ';' | cut -c1-160)
        NROWS+=("$(printf '%-62s %-14s %s' "$t" "$st" "$detail")")
        echo "nccl $t: $st"
        [ $rc -ne 0 ] && grep -E 'panicked|FAILED|assert' "$LOG/nccl-$t.log" | head -5
    done
fi

# --- 4b. fusion ---------------------------------------------------------------
# The whole step with the fused kernels (ASRFORGE_FUSION=all: flash attention,
# the fused losses) against the compositions (none), in fp16 and bf16:
# frames/s, peak memory, launches and the last loss (equal within the dtype's
# tolerance is what tests/gpu_profile.rs asserts on the emulator).
declare -a FROWS
for dt in fp16 bf16; do
    for f in none all; do
        line=$(ASRFORGE_FUSION=$f timeout 90 "$BIN" bench-train --config "$CONFIG" "${OVERRIDES[@]}" --steps 10 --warmup 3 --device cuda \
            --dtype "$dt" --batch_size "$BATCH" --frames "$FRAMES" 2> "$LOG/fusion-$dt-$f.log" | grep '^bench-train' | tail -1)
        FROWS+=("$(python3 - "$dt" "$f" "$line" <<'PY'
import sys
dt, f, line = sys.argv[1:4]
head, _, steady = line.partition("per_step(")
g = dict(w.split("=", 1) for w in head.split()[1:] if "=" in w)
s = dict(w.split("=", 1) for w in steady.split() if "=" in w)
print(f"{dt:<5} {f:<5} {g.get('frames_per_s', 'failed'):>10} {g.get('step_ms_median', '-'):>9} {g.get('peak_mib', '-'):>9} {s.get('launches', '-'):>9} {g.get('last_loss', '-'):>12}")
PY
)")
    done
done

# --- 6. tables --------------------------------------------------------------
{
    echo
    echo "== asrforge GPU check ($(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)) =="
    echo "tests (ASRFORGE_CUDA_POISON=1):"
    printf '  %s\n' "${TROWS[@]:-none staged}"
    echo "bench-train: $(basename "$CONFIG"), $STEPS steps, batch $BATCH x $FRAMES frames, ${OVERRIDES[*]}"
    echo "  dtype  init(gpu)   init(cpu)   rel.diff  first_loss  last_loss skip   frames/s  peak_MiB  check"
    printf '  %s\n' "${RROWS[@]}"
    echo "throughput (per steady-state step; tf32 = fp32 with --tf32):"
    echo "  dtype  frames/s   step_ms  peak_MiB  launches   gemms  lt_heu  syncs  d_alloc"
    printf '  %s\n' "${TPROWS[@]}"
    echo "step profile (bench-train --profile, batch $BATCH x $FRAMES; model_ms is a MODEL, measured_ms from CUDA events):"
    printf '  %s\n' "${PROWS[@]:-none}"
    echo "fusion (ASRFORGE_FUSION=all vs none, 10 steps after 3 warm-up, batch $BATCH x $FRAMES):"
    echo "  dtype fusion  frames/s   step_ms  peak_MiB  launches    last_loss"
    printf '  %s\n' "${FROWS[@]:-none}"
    echo "NCCL (world size 1 on one GPU; $(cat "$LOG/nccl-info.txt" 2>/dev/null | tr '\n' ' ')):"
    printf '  %s\n' "${NROWS[@]:-none}"
    echo "  not exercised here: several GPUs, a peer's failure under NCCL, the overlap of bucket all-reduces with backward"
    echo "total $(( $(date +%s) - START )) s; logs in $LOG"
} | tee "$LOG/summary.txt"
