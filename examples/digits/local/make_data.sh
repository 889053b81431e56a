#!/usr/bin/env bash
# Makes the spoken-digits demo corpus: espeak-ng speech (several voices,
# speeds, pitches) at 16 kHz, train/dev/test data.list, units.txt, and the
# training set's global_cmvn computed by `asrforge compute-cmvn`.
#
# Usage (from examples/digits):  local/make_data.sh [--train N] [--dev N] [--test N] [--data DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v espeak-ng >/dev/null || need+=(espeak-ng)
command -v sox >/dev/null || need+=(sox)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing ${need[*]} with apt-get" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "error: ${need[*]} missing; install them first, e.g. 'sudo apt-get install ${need[*]}'" >&2
    exit 1
  fi
fi

data=data
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --data) data="$2"; args+=("$1" "$2"); shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done

python3 local/make_data.py "${args[@]}"

root="$(cd ../.. && pwd)"
bin="${ASRFORGE:-$root/target/release/asrforge}"
if [ ! -x "$bin" ]; then
  echo "building asrforge (release)" >&2
  cargo build --release --manifest-path "$root/Cargo.toml" --bin asrforge
fi
"$bin" compute-cmvn --num_workers 2 --train_config conf/train.yaml \
  --data_list "$data/train/data.list" --out_cmvn "$data/train/global_cmvn"
echo "done: $data/{train,dev,test}/data.list, $data/dict/units.txt, $data/train/global_cmvn" >&2
