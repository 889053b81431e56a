#!/usr/bin/env bash
# Plants one-line bugs, one at a time, in a copy of the tree and runs the
# test files that should catch each; reports killed / survived per mutant
# and the kill rate. The working tree is never touched.
#
#   scripts/mutants.sh            # every mutant
#   scripts/mutants.sh 1 4 7      # only these (1-based)
#
# The copy lives in $MUTANTS_DIR (default /tmp/asrforge-mutants) with its own
# target dir, seeded once from ./target so each mutant only rebuilds the
# crate (incremental). Each mutant's log: $MUTANTS_DIR/logs/N.log.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${MUTANTS_DIR:-/tmp/asrforge-mutants}
tree=$dir/tree
export CARGO_TARGET_DIR=$dir/target CARGO_PROFILE_RELEASE_INCREMENTAL=true CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2}

# file @@ text found exactly once (\n: a line break) @@ its replacement @@ test files (space separated)
mutants=(
  'src/ops/label_smoothing.rs @@ if normalize_length { valid.max(1) } else { b.max(1) } @@ if normalize_length { b.max(1) } else { valid.max(1) } @@ right_from_wrong ops_forward'
  'src/nn/attention.rs @@ ops::add(&q, &self.pos_bias_u) @@ ops::add(&q, &self.pos_bias_v) @@ right_from_wrong'
  'src/data/specaug.rs @@ for _ in 0..conf.num_t_mask {\n        let start = randint(rng, 0, frames - 1); @@ for _ in 0..conf.num_t_mask {\n        let start = randint(rng, 0, frames.min(bins) - 1); @@ right_from_wrong data_specaug'
  'src/engine/ddp.rs @@ c.all_reduce(&flat, ReduceOp::Avg)?; @@ c.all_reduce(&flat, ReduceOp::Sum)?; @@ dist_ddp'
  'src/backend/cpu/loss.rs @@ let off = smoothing / (v as f64 - 1.0); @@ let off = smoothing / v as f64; @@ right_from_wrong ops_forward'
  'src/nn/attention.rs @@ let scores = ops::mul_scalar(&ops::add(&ac, &bd)?, 1.0 / (a.d_k() as f64).sqrt())?; @@ let scores = ops::mul_scalar(&ops::add(&ac, &bd)?, 1.0 / (a.d_k() as f64))?; @@ right_from_wrong'
  'src/data/specaug.rs @@ let start = randint(rng, 0, bins - 1); @@ let start = randint(rng, 0, bins - 2); @@ right_from_wrong data_specaug'
  'src/nn/attention.rs @@ m.extend((0..t).map(|j| u8::from(j > i || j >= l))); @@ m.extend((0..t).map(|j| u8::from(j > i || j > l))); @@ masking'
  'src/backend/cpu/optim.rs @@ p[i] = p[i] - lr * (m[i] * ibc1) / (v[i].sqrt() * isbc2 + eps); @@ p[i] = p[i] + lr * (m[i] * ibc1) / (v[i].sqrt() * isbc2 + eps); @@ optim'
  'src/backend/cpu/ctc.rs @@ if s >= 2 && ext(s) != blank && ext(s) != ext(s - 2) { @@ if s >= 2 && ext(s) != blank { @@ ctc'
  'src/optim/clip.rs @@ let c = max_norm / (norm + 1e-6); @@ let c = norm / (max_norm + 1e-6); @@ optim'
  'src/train/executor.rs @@ let mut loss = crate::ops::mul_scalar(&out.loss, 1.0 / self.cfg.accum_grad as f64)?; @@ let mut loss = crate::ops::mul_scalar(&out.loss, 1.0)?; @@ dist_ddp'
  'src/ops/label_smoothing.rs @@ if normalize_length { valid.max(1) } else { b.max(1) } @@ if normalize_length { b.max(1) } else { valid.max(1) } @@ train_e2e'
  'src/models/ctc.rs @@ Ok((ops::mul_scalar(&sum, 1.0 / b as f64)?, infeasible)) @@ Ok((ops::mul_scalar(&sum, 1.0)?, infeasible)) @@ train_e2e'
)

mkdir -p "$dir/logs"
# The copy: the working tree's tracked and untracked (not ignored) files,
# less those deleted in the working tree but not yet committed.
rm -rf "$tree" && mkdir -p "$tree"
(cd "$root" && git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done | tar --null -T - -cf -) | tar -x -C "$tree"
[ -d "$CARGO_TARGET_DIR" ] || cp -a "$root/target" "$CARGO_TARGET_DIR"

pick=("$@")
[ ${#pick[@]} -eq 0 ] && pick=($(seq 1 ${#mutants[@]}))
killed=0 survived=0 unviable=0
for n in "${pick[@]}"; do
  m=${mutants[$((n - 1))]}
  file=${m%% @@ *}; m=${m#* @@ }
  from=${m%% @@ *}; m=${m#* @@ }
  to=${m%% @@ *}; tests=${m#* @@ }
  path=$tree/$file
  cp "$path" "$path.orig"
  if ! python3 - "$path" "$from" "$to" <<'PY'; then
import sys
p, a, b = (x.replace("\\n", "\n") for x in sys.argv[1:])
s = open(p).read()
if s.count(a) != 1:
    sys.exit(f"expected the text once in {p}, found it {s.count(a)} times: {a}")
open(p, "w").write(s.replace(a, b))
PY
    echo "mutant $n: NOT PLANTED ($file)"; unviable=$((unviable + 1)); mv "$path.orig" "$path"; continue
  fi
  args=()
  for t in $tests; do args+=(--test "$t"); done
  log=$dir/logs/$n.log
  start=$(date +%s)
  (cd "$tree" && cargo test --release --no-fail-fast "${args[@]}" >"$log" 2>&1)
  rc=$?
  secs=$(( $(date +%s) - start ))
  if grep -q "^error\(\[E[0-9]*\]\)\?: could not compile\|^error\[E" "$log"; then
    verdict="unviable (does not compile)"; unviable=$((unviable + 1))
  elif [ $rc -ne 0 ]; then
    failing=$(grep -o "^    [a-z_0-9:]*$" "$log" | tr -d ' ' | sort -u | tr '\n' ' ')
    verdict="KILLED by: ${failing:-failed run}"; killed=$((killed + 1))
  else
    verdict="SURVIVED"; survived=$((survived + 1))
  fi
  mv "$path.orig" "$path"
  echo "mutant $n ($file: ${from:0:60}) [$tests, ${secs}s]: $verdict"
done
total=$((killed + survived))
echo "killed $killed of $total viable mutants ($unviable unviable); kill rate $(( total > 0 ? 100 * killed / total : 0 ))%"
