#!/usr/bin/env bash
# Runs the staged GPU check on a GPU host with no Rust and no network (see
# GPU.md), from the repository root, after scripts/gpu-check.sh packed
# .device/payload.tar.xz on a build machine (unpacked here into /tmp):
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
#      values, destroy), the non-blocking init of a job of 2 whose rank 1 never
#      comes failing within its 3 s timeout, DDP and ZeRO-2 over NCCL at world size 1 equal to one
#      process after 20 steps, and DDP/ZeRO-1/2 on the GPU at 2 processes over
#      gloo; one GPU exercises world size 1 of NCCL only (no link is measured);
#   6. prints the tables last.
# Full logs are written to /tmp/asrforge-gpu-run and, when $OUT is set,
# packed into $OUT/logs.tgz with $OUT/summary.txt (the device tool returns
# at most 8 files). BUDGET (seconds, default 420) bounds the whole: each
# section checks what is left and says NOT RUN for what did not fit.
# SECTIONS (default "ceil tests train pytorch profile fusion sweep nccl
# bisect sanitize bench sdpa") picks sections (sdpa: PyTorch's
# scaled_dot_product_attention on the flash_attention benches' shapes,
# SDPA_DTYPES default bf16,fp16); TESTS (default all staged) names test
# binaries to run; DTYPES, FUSION_DTYPES, SWEEPS ("VAR=value[+VAR=value] ..."), BENCH_FILTER (a criterion filter),
# SANITIZE_SPECS ("tool kernel-substring;..."), SANITIZE_FUSION narrow them.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d .device ] || cd ..   # also runs as .device/gpu-run.sh
DEV=$PWD/.device
if [ -f "$DEV/payload.tar.xz" ]; then
    # scripts/gpu-check.sh packs the staged binaries; unpack them outside the tree.
    rm -rf /tmp/asrforge-device && mkdir -p /tmp/asrforge-device
    tar xJf "$DEV/payload.tar.xz" -C /tmp/asrforge-device || { echo "gpu-run: cannot unpack $DEV/payload.tar.xz"; exit 1; }
    DEV=/tmp/asrforge-device
fi
LOG=/tmp/asrforge-gpu-run
rm -rf "$LOG"
mkdir -p "$LOG"
START=$(date +%s)
BUDGET=${BUDGET:-420}
SECTIONS=${SECTIONS:-ceil tests train pytorch profile fusion sweep nccl bisect sanitize bench sdpa}
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
want() { [[ " $SECTIONS " == *" $1 "* ]]; }
pack() {
    if [ -n "${OUT:-}" ]; then
        tar czf "$OUT/logs.tgz" -C /tmp asrforge-gpu-run 2>/dev/null
        [ -f "$LOG/summary.txt" ] && cp "$LOG/summary.txt" "$OUT/summary.txt"
    fi
}
trap pack EXIT
BIN=$DEV/bin/asrforge
STEPS=${STEPS:-50}
BATCH=${BATCH:-16}
FRAMES=${FRAMES:-512}
# The AISHELL conformer without its CMVN block: synthetic features need no
# statistics file (bench-train draws them; the model is otherwise the same).
if [ -z "${CONFIG:-}" ]; then
    CONFIG=/tmp/asrforge-train_conformer.yaml
    sed '/^cmvn:/,/^  is_json_cmvn:/d' "$DEV/conf/train_conformer.yaml" > "$CONFIG"
fi
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
nvidia-smi > "$LOG/nvidia-smi.txt" 2>&1 || true
"$BIN" info > "$LOG/info.txt" 2>&1 || echo "asrforge info failed: $(tail -1 "$LOG/info.txt")"
cat "$LOG/info.txt"

# --- 0. ceilings ------------------------------------------------------------
# The host's own ceilings through PyTorch (GPU.md): a large device copy
# (bytes read + written over time) and a large bf16 product on random data.
CEIL="not run"
if want ceil; then
    CEIL=$(timeout 60 python3 - <<'PY' 2> "$LOG/ceil.log"
import torch
def t(f, n=20):
    for _ in range(3):
        f()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(n):
        s.record(); f(); e.record(); torch.cuda.synchronize(); ms.append(s.elapsed_time(e))
    return sorted(ms)[len(ms) // 2]
x = torch.randn(1 << 28, device="cuda"); y = torch.empty_like(x)
bw = 2 * x.numel() * 4 / (t(lambda: y.copy_(x)) / 1e3) / 1e12
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
tf = 2 * 8192**3 / (t(lambda: a @ b) / 1e3) / 1e12
print(f"copy {bw:.2f} TB/s, bf16 matmul 8192^3 {tf:.0f} TFLOP/s (torch {torch.__version__})")
PY
)
    echo "ceilings: ${CEIL:-failed (see ceil.log)}"
fi

# --- 2. GPU tests -----------------------------------------------------------
# Four binaries at a time (one GPU, 16 cores: the CPU references dominate),
# each with poisoned fresh allocations and its own time limit.
declare -a TROWS
if want tests; then
    TLIST=${TESTS:-$(ls "$DEV/tests")}
    TLIM=$(( $(left) / 2 )); [ "$TLIM" -gt 150 ] && TLIM=150
    printf '%s\n' $TLIST | xargs -P 4 -I{} sh -c \
        "ASRFORGE_CUDA_POISON=1 timeout $TLIM '$DEV/tests/{}' --test-threads=2 > '$LOG/test-{}.log' 2>&1; echo \$? > '$LOG/test-{}.rc'"
    for name in $TLIST; do
        rc=$(cat "$LOG/test-$name.rc" 2>/dev/null || echo none)
        res=$(grep -E '^test result:' "$LOG/test-$name.log" | tail -1 | sed 's/^test result: //')
        skipped=$(grep -ci 'skipped' "$LOG/test-$name.log")
        [ "$rc" = 0 ] && st=ok || st="FAILED (rc $rc)"
        TROWS+=("$(printf '%-22s %-14s %s; %s lines say skipped' "$name" "$st" "${res:-no result line}" "$skipped")")
        if [ "$rc" != 0 ]; then
            while IFS= read -r l; do TROWS+=("    $l"); done < <(grep -E '^test .* FAILED|panicked' "$LOG/test-$name.log" | cut -c1-220 | head -8)
        fi
    done
fi

# --- 3. training ------------------------------------------------------------
field() { grep -o "$1=[^ ]*" <<<"$2" | head -1 | cut -d= -f2; }
declare -a RROWS TPROWS PTROWS
for dt in ${DTYPES:-fp32 tf32 fp16 bf16}; do
    want train || break
    if [ "$(left)" -lt 60 ]; then RROWS+=("$dt NOT RUN (out of time)"); continue; fi
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
    # PyTorch on the same GPU, the same model (parameter count asserted) and
    # batch shapes, the same dtype handling (autocast; GradScaler for fp16).
    if want pytorch && [ -f "$DEV/bench_pytorch_ref.py" ]; then
        params=$(field params "$gpu")
        pt=$(timeout 90 python3 "$DEV/bench_pytorch_ref.py" --config "$CONFIG" --override "scheduler_conf.warmup_steps 10" \
            --device cuda --dtype "$dt" --batch_size "$BATCH" --frames "$FRAMES" --steps 23 --warmup 3 --threads 8 \
            ${params:+--params "$params"} 2> "$LOG/pytorch-$dt.log" | grep '^pytorch' | tail -1)
        echo "torch $dt: ${pt:-failed (see pytorch-$dt.log: $(tail -1 "$LOG/pytorch-$dt.log"))}"
        echo "$pt" >> "$LOG/bench-train.txt"
        PTROWS+=("$(python3 - "$dt" "$gpu" "$pt" <<'PY'
import sys
dt, gpu, pt = sys.argv[1:4]
def f(line):
    return dict(w.split("=", 1) for w in line.split()[1:] if "=" in w and "(" not in w)
g, p = f(gpu.partition("per_step(")[0]), f(pt)
def num(d, k):
    try:
        return float(d[k])
    except (KeyError, ValueError):
        return float("nan")
ga, pa = num(g, "frames_per_s"), num(p, "frames_per_s")
print(f"{dt:<5} {ga:>10.0f} {pa:>10.0f} {ga / pa if pa == pa and pa else float('nan'):>6.2f} {num(g,'peak_mib'):>9.1f} {num(p,'peak_mib'):>9.1f}")
PY
)")
    fi
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
print(f"{dt:<5} {get(g,'frames_per_s'):>10} {get(g,'step_ms_median'):>9} {get(g,'peak_mib'):>9} {get(s,'launches'):>9} {get(s,'gemms'):>7} {get(s,'lt_heuristics'):>6} {get(s,'host_syncs'):>6} {get(s,'host_wait_ms'):>9} {get(s,'driver_allocs'):>7}")
PY
)")
done

# --- 4. step profile ------------------------------------------------------
# One steady-state step (the last of 3, after 2 warm-up steps) per dtype,
# timed per launch with CUDA events beside the model.
declare -a PROWS
for dt in bf16 fp32; do
    want profile || break
    if [ "$(left)" -lt 45 ]; then PROWS+=("$dt NOT RUN (out of time)"); continue; fi
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
if ! want nccl; then
    NROWS+=("not selected")
elif [ ! -x "$NCCL_BIN" ]; then
    NROWS+=("not staged (.device/nccl/dist_gpu missing: rerun scripts/gpu-check.sh)")
else
    "$BIN" info 2>&1 | grep -i '^NCCL' | sed 's/^/info: /' > "$LOG/nccl-info.txt"
    for t in nccl_world_1_collectives_on_f32_f16_bf16 \
             nccl_init_without_a_peer_fails_within_the_timeout \
             nccl_ddp_and_zero2_at_world_1_match_one_process_after_20_steps \
             nccl_ddp_half_grad_sync_at_world_1_within_half_rounding_of_one_process \
             gpu_ddp_and_zero_equal_one_process_at_2_ranks; do
        if [ "$(left)" -lt 30 ]; then
            NROWS+=("$(printf '%-62s %s' "$t" 'NOT RUN (out of time)')")
            continue
        fi
        ASRFORGE_REQUIRE_NCCL=1 timeout 120 "$NCCL_BIN" "$t" --exact --nocapture --test-threads=1 > "$LOG/nccl-$t.log" 2>&1
        rc=$?
        [ $rc -eq 0 ] && st=ok || st="FAILED (rc $rc)"
        detail=$(grep -E 'NCCL (world size 1|ddp|zero2|init|[0-9])|skipped|REL ' "$LOG/nccl-$t.log" | tr '\n' ';' | cut -c1-160)
        NROWS+=("$(printf '%-62s %-14s %s' "$t" "$st" "$detail")")
        echo "nccl $t: $st"
        [ $rc -ne 0 ] && grep -E 'panicked|FAILED|assert' "$LOG/nccl-$t.log" | head -5
    done
fi

# --- 4b. fusion ---------------------------------------------------------------
# The whole step with the fused kernels (ASRFORGE_FUSION=all: flash attention,
# the fused losses, the residual adds fused with the norms, the convolution
# module) against the compositions (none), in fp16 and bf16:
# frames/s, peak memory, launches and the last loss (equal within the dtype's
# tolerance is what tests/gpu_profile.rs asserts on the emulator).
declare -a FROWS
for dt in ${FUSION_DTYPES:-fp16 bf16}; do
    for f in none all; do
        want fusion || break 2
        if [ "$(left)" -lt 25 ]; then FROWS+=("$dt $f NOT RUN (out of time)"); continue; fi
        line=$(ASRFORGE_FUSION=$f timeout 90 "$BIN" bench-train --config "$CONFIG" "${OVERRIDES[@]}" --steps 10 --warmup 3 --device cuda \
            --dtype "$dt" --batch_size "$BATCH" --frames "$FRAMES" 2> "$LOG/fusion-$dt-$f.log" | grep '^bench-train' | tail -1)
        FROWS+=("$(python3 - "$dt" "$f" "$line" <<'PY'
import sys
dt, f, line = sys.argv[1:4]
head, _, steady = line.partition("per_step(")
g = dict(w.split("=", 1) for w in head.split()[1:] if "=" in w)
s = dict(w.split("=", 1) for w in steady.split() if "=" in w)
print(f"{dt:<5} {f:<5} {g.get('frames_per_s', 'failed'):>10} {g.get('step_ms_median', '-'):>9} {g.get('peak_mib', '-'):>9} {s.get('launches', '-'):>9} {s.get('host_wait_ms', '-'):>8} {g.get('last_loss', '-'):>12}")
PY
)")
    done
done

# --- 4c. launch-shape sweeps -----------------------------------------------------
# Knobs that set how many blocks a kernel family runs, read once per
# process: the fused AdamW chunk (ASRFORGE_MT_CHUNK, elements per block) and
# layer norm's backward rows per block (ASRFORGE_LN_CHUNK); and, with every
# fusion on, which attention kernel set runs (ASRFORGE_ATTENTION_KERNEL:
# wmma64, the default at d_k 64, against the wide wmma set and the scalar
# one). A spec sets one or more variables joined by '+'. Per value: the
# bf16 step time and the profile's measured ms of the families it moves.
declare -a MROWS
if want sweep; then
    for spec in ${SWEEPS:-ASRFORGE_MT_CHUNK=65536 ASRFORGE_MT_CHUNK=16384 ASRFORGE_MT_CHUNK=4096 ASRFORGE_LN_CHUNK=64 ASRFORGE_LN_CHUNK=16 ASRFORGE_LN_CHUNK=8 \
            ASRFORGE_FUSION=all+ASRFORGE_ATTENTION_KERNEL=wmma64 ASRFORGE_FUSION=all+ASRFORGE_ATTENTION_KERNEL=wmma ASRFORGE_FUSION=all+ASRFORGE_ATTENTION_KERNEL=scalar}; do
        if [ "$(left)" -lt 30 ]; then MROWS+=("$spec NOT RUN (out of time)"); continue; fi
        # shellcheck disable=SC2086 # one word per variable
        env ${spec//+/ } timeout 60 "$BIN" bench-train --config "$CONFIG" "${OVERRIDES[@]}" --steps 4 --warmup 2 --device cuda --dtype bf16 \
            --batch_size "$BATCH" --frames "$FRAMES" --profile > "$LOG/sweep-$spec.txt" 2> "$LOG/sweep-$spec.log"
        line=$(grep '^bench-train' "$LOG/sweep-$spec.txt" | tail -1)
        # The GPU table's rows and its total (7 columns; the op table has its own total line).
        fam=$(awk '(/^(optim\/mt_|norm\/(add_)?layer_norm_bwd|attention\/)/ || /^total /) && NF == 7 {printf "%s %s launches %s ms; ", $1, $2, $NF}' "$LOG/sweep-$spec.txt")
        MROWS+=("$(printf '%-24s step_ms %s; %s' "$spec" "$(field step_ms_median "$line")" "$fam")")
    done
fi

# --- 7. fusion bisection -----------------------------------------------------
# The tiny config in f32 with each fused family alone (qkv with attention,
# which it needs), and all twice (a race moves the loss between two
# identical runs): which family moves the loss from the composition's, and
# by how much.
declare -a BROWS
if want bisect; then
    TINY=$DEV/conf/tiny.yaml
    for f in none none attention attention,qkv loss norm convmodule ffn posenc subsampling all all; do
        if [ "$(left)" -lt 20 ]; then BROWS+=("$f NOT RUN (out of time)"); continue; fi
        line=$(ASRFORGE_FUSION=$f timeout 60 "$BIN" bench-train --config "$TINY" --steps 3 --warmup 1 --device cuda --dtype fp32 \
            --batch_size 2 --frames 64 --seed 7 2> "$LOG/bisect-$f.log" | grep '^bench-train' | tail -1)
        BROWS+=("$(printf '%-10s init %s first %s last %s' "$f" "$(field init_loss "$line")" "$(field first_loss "$line")" "$(field last_loss "$line")")")
    done
fi

# --- 8. sanitizers -------------------------------------------------------------
# compute-sanitizer on one tiny fused step: racecheck (shared-memory hazards)
# and initcheck (reads of device memory nothing wrote) on the fused kernels,
# memcheck on every kernel.
declare -a SROWS
if want sanitize; then
    CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer 2>/dev/null | head -1)
    if [ -z "$CS" ]; then
        SROWS+=("compute-sanitizer not found")
    else
        IFS=';' read -ra SPECS <<< "${SANITIZE_SPECS:-racecheck attention;racecheck ctc;racecheck label_smoothing;initcheck attention;memcheck -}"
        for spec in "${SPECS[@]}"; do
            set -- $spec
            if [ "$(left)" -lt 40 ]; then SROWS+=("$spec NOT RUN (out of time)"); continue; fi
            filt=(); [ "$2" != - ] && filt=(--kernel-name "kns=$2")
            ASRFORGE_FUSION=${SANITIZE_FUSION:-all} timeout 90 "$CS" --tool "$1" "${filt[@]}" --print-limit 20 "$BIN" bench-train --config "$DEV/conf/tiny.yaml" \
                --steps 1 --warmup 0 --device cuda --dtype fp32 --batch_size 2 --frames 64 --seed 7 > "$LOG/sanitize-$1-$2.log" 2>&1
            rc=$?
            summ=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|hazard|Uninitialized|Invalid' "$LOG/sanitize-$1-$2.log" | sort | uniq -c | sort -rn | head -3 | tr -s ' ' | tr '\n' ';' | cut -c1-200)
            SROWS+=("$(printf '%-10s %-18s rc %-4s %s' "$1" "$2" "$rc" "$summ")")
        done
    fi
fi

# --- 9. kernel benches ------------------------------------------------------------
# Every staged criterion binary in turn (gpu_kernels: the kernels, fused and
# composed; optim: the fused AdamW step, the AISHELL conformer's parameters
# among them), BENCH_FILTER passed to each.
declare -a KROWS
for bench in gpu_kernels optim; do
    want bench && [ -x "$DEV/benches/$bench" ] || continue
    BLIM=$(( $(left) - 20 )); [ "$BLIM" -gt 150 ] && BLIM=150
    if [ "$BLIM" -gt 30 ]; then
        (cd /tmp && timeout "$BLIM" "$DEV/benches/$bench" --bench --warm-up-time 0.2 --measurement-time 0.6 --noplot ${BENCH_FILTER:-} > "$LOG/bench-$bench.log" 2>&1)
        # Criterion prints a bench's name, then (on that line or the next) its
        # time, then with a throughput its thrpt line: one row per bench.
        while IFS= read -r l; do KROWS+=("$l"); done < <(python3 - "$LOG/bench-$bench.log" <<'PY'
import re, sys
name, rows = None, []
for line in open(sys.argv[1], errors="replace"):
    line = line.rstrip("\n")
    m = re.match(r"^(\S+)\s*(time:\s*(\[.*\]))?", line)
    if m and not line.startswith(("Benchmarking", "Found", "Warning", "WARNING", "Gnuplot", "Testing", "Success")) and "/" in m.group(1):
        name = m.group(1)
        if m.group(3):
            rows.append([name, m.group(3), ""])
        continue
    t = re.match(r"^\s+time:\s*(\[.*\])", line)
    if t and name:
        rows.append([name, t.group(1), ""])
    th = re.match(r"^\s+thrpt:\s*(\[.*\])", line)
    if th and rows:
        rows[-1][2] = "thrpt " + th.group(1)
for r in rows:
    print(" ".join(x for x in r if x)[:170])
PY
)
    else
        KROWS+=("$bench NOT RUN (out of time)")
    fi
done

# --- 10. attention against PyTorch's SDPA ----------------------------------------
# The flash_attention benches above (asrforge fused vs its composition) have
# a PyTorch twin: the same shapes, lengths, dropout and FLOP count through
# scaled_dot_product_attention with the positional term as an explicit bias
# mask (scripts/bench_sdpa_ref.py, checked against the definition first).
declare -a AROWS
if want sdpa && [ -f "$DEV/bench_sdpa_ref.py" ]; then
    if [ "$(left)" -gt 40 ]; then
        SDPA_DTYPES=${SDPA_DTYPES:-bf16,fp16}
        timeout $(( $(left) - 20 )) python3 "$DEV/bench_sdpa_ref.py" --device cuda --dtypes "$SDPA_DTYPES" --check > "$LOG/sdpa.log" 2>&1
        while IFS= read -r l; do AROWS+=("$l"); done < <(grep -E '^(sdpa|check .*FAILED|#)' "$LOG/sdpa.log"; tail -1 "$LOG/sdpa.log" | grep -v '^sdpa')
    else
        AROWS+=("NOT RUN (out of time)")
    fi
fi

# --- 6. tables --------------------------------------------------------------
{
    echo
    echo "== asrforge GPU check ($(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)) =="
    echo "tests (ASRFORGE_CUDA_POISON=1):"
    printf '  %s\n' "${TROWS[@]:-none staged}"
    echo "bench-train: $(basename "$CONFIG"), $STEPS steps, batch $BATCH x $FRAMES frames, ${OVERRIDES[*]}"
    echo "  dtype  init(gpu)   init(cpu)   rel.diff  first_loss  last_loss skip   frames/s  peak_MiB  check"
    printf '  %s\n' "${RROWS[@]}"
    echo "ceilings: ${CEIL:-failed (see ceil.log)}"
    echo "asrforge vs PyTorch on this GPU (same model and batch shapes; frames/s = valid input frames per median step):"
    echo "  dtype  asrforge    pytorch  ratio  peak(af)  peak(pt)"
    printf '  %s\n' "${PTROWS[@]:-none}"
    echo "throughput (per steady-state step; tf32 = fp32 with --tf32):"
    echo "  dtype  frames/s   step_ms  peak_MiB  launches   gemms  lt_heu  syncs  wait_ms  d_alloc   (wait_ms: host time in those syncs per step; near 0 = the host's enqueueing is the bottleneck)"
    printf '  %s\n' "${TPROWS[@]}"
    echo "step profile (bench-train --profile, batch $BATCH x $FRAMES; model_ms is a MODEL, measured_ms from CUDA events):"
    printf '  %s\n' "${PROWS[@]:-none}"
    echo "fusion (ASRFORGE_FUSION=all vs none, 10 steps after 3 warm-up, batch $BATCH x $FRAMES):"
    echo "  dtype fusion  frames/s   step_ms  peak_MiB  launches  wait_ms    last_loss"
    printf '  %s\n' "${FROWS[@]:-none}"
    echo "NCCL (world size 1 on one GPU; $(cat "$LOG/nccl-info.txt" 2>/dev/null | tr '\n' ' ')):"
    printf '  %s\n' "${NROWS[@]:-none}"
    echo "  not exercised here: several GPUs, a peer's failure under NCCL, the overlap of bucket all-reduces with backward"
    echo "launch-shape sweeps (bf16, batch $BATCH x $FRAMES; family, launches, measured ms):"
    printf '  %s\n' "${MROWS[@]:-not run}"
    echo "fusion bisection (tiny config, f32, 2 x 64 frames, seed 7; each family alone, all twice):"
    printf '  %s\n' "${BROWS[@]:-not run}"
    echo "compute-sanitizer (one tiny fused f32 step):"
    printf '  %s\n' "${SROWS[@]:-not run}"
    echo "benches (criterion gpu_kernels and optim, short: warm-up 0.2 s, 0.6 s measured):"
    printf '  %s\n' "${KROWS[@]:-not run}"
    echo "attention fwd+bwd, 18*B*H*T^2*d FLOPs (asrforge: the flash_attention rows above, thrpt in Gelem/s = GFLOP/s;"
    echo "  PyTorch: SDPA with the positional bias as a float mask, SDPA without it, eager; extra_peak_mib over the inputs):"
    printf '  %s\n' "${AROWS[@]:-not run}"
    echo "total $(( $(date +%s) - START )) s; logs in $LOG"
} | tee "$LOG/summary.txt"
pack
