#!/usr/bin/env bash
# Spoken-digits recipe in the layout of WeNet's run.sh:
#   0 data  1 cmvn  2 train  3 average  4 recognize  5 score
# Run from examples/digits. Any variable below can be set on the command
# line as `--name value`, e.g. `./run.sh --stage 2 --stop_stage 5`.
# Several training processes (asrforge launch, the TCP communicator on the
# CPU): `NPROC=2 ./run.sh`, with DeepSpeed's ZeRO:
# `NPROC=2 TRAIN_ENGINE=deepspeed DS_CONFIG=../../conf/ds_stage2.json ./run.sh`.
# U2 (one model for streaming and full context): `./run.sh --use_dynamic_chunk true`
# trains with dynamic chunk masks and a causal convolution, then decodes with
# full context and with chunks of 16 and 4 frames (--decoding_chunk_sizes).
# BPE units (WeNet's `tokenizer: bpe`): `./run.sh --token_type bpe --nbpe 24`
# trains a sentencepiece model on the training transcripts in stage 0
# (local/train_bpe.py; sentencepiece goes into ~/.cache/asrforge/spm-venv)
# and trains and decodes with it; use another --dir than the char model's.
set -euo pipefail
cd "$(dirname "$0")"

stage=0
stop_stage=5
data=data
dir=exp/conformer
train_config=conf/train.yaml
num_workers=2
average_num=5
beam_size=10
ctc_weight=0.3
attention_ctc_weight=0.3      # CTC prefix scores in attention beam search; 0: WeNet's attention only
reverse_weight=0.0
decode_modes="ctc_greedy_search ctc_prefix_beam_search attention attention_rescoring"
use_dynamic_chunk=false       # true: U2 dynamic chunk training (with causal: true)
decoding_chunk_sizes=""       # default: -1, or "-1 16 4" with use_dynamic_chunk
num_decoding_left_chunks=-1
token_type=char               # char, or bpe (a sentencepiece model trained in stage 0)
nbpe=24                       # sentencepiece vocabulary size with --token_type bpe
bpemode=unigram               # unigram (WeNet's LibriSpeech default) or bpe
nproc="${NPROC:-1}"                       # training processes on this node
train_engine="${TRAIN_ENGINE:-torch_ddp}" # torch_ddp or deepspeed
deepspeed_config="${DS_CONFIG:-}"         # the DeepSpeed JSON of --train_engine deepspeed
master_port="${MASTER_PORT:-29500}"

# WeNet's tools/parse_options.sh, reduced to `--name value` for the variables above.
while [ $# -gt 0 ]; do
  name="${1#--}"
  if [ "$name" = "$1" ] || [ $# -lt 2 ] || ! declare -p "$name" >/dev/null 2>&1; then
    echo "error: unknown option '$1' (expected --name value for one of the recipe's variables)" >&2
    exit 1
  fi
  printf -v "$name" '%s' "$2"
  shift 2
done

root="$(cd ../.. && pwd)"
echo "building asrforge (cargo build --release)" >&2
cargo build --release --manifest-path "$root/Cargo.toml" --bin asrforge
bin="$root/target/release/asrforge"
export ASRFORGE="$bin"

if [ -z "$decoding_chunk_sizes" ]; then
  if [ "$use_dynamic_chunk" = true ]; then decoding_chunk_sizes="-1 16 4"; else decoding_chunk_sizes="-1"; fi
fi
chunk_args=()
if [ "$use_dynamic_chunk" = true ]; then
  chunk_args=(--override_config "encoder_conf.use_dynamic_chunk true" --override_config "encoder_conf.causal true")
fi
# The results of chunk size c go to $dir/test (c = -1) or $dir/test_chunk$c.
result_dir_of() { if [ "$1" = -1 ]; then echo "$dir/test"; else echo "$dir/test_chunk$1"; fi; }

# The units table and, for bpe, the sentencepiece model and the config keys that name them.
dict="$data/dict/units.txt"
token_args=()
if [ "$token_type" = bpe ]; then
  bpemodel="$data/dict/bpe_${bpemode}${nbpe}"
  dict="$data/dict/units_${bpemode}${nbpe}.txt"
  token_args=(--override_config "tokenizer bpe" --override_config "tokenizer_conf.bpe_path $bpemodel.model")
elif [ "$token_type" != char ]; then
  echo "error: --token_type: expected char or bpe, found '$token_type'" >&2
  exit 1
fi

cmvn="$data/train/global_cmvn"
decode_checkpoint="$dir/avg_${average_num}.safetensors"

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  echo "stage 0: data" >&2
  local/make_data.sh --data "$data"
  if [ "$token_type" = bpe ]; then
    python3 local/train_bpe.py --text "$data/train/text" --nbpe "$nbpe" --mode "$bpemode" --out "$data/dict"
  fi
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  echo "stage 1: cmvn" >&2
  # make_data.sh already writes the statistics; recompute only when they are stale.
  if [ ! -s "$cmvn" ] || [ "$data/train/data.list" -nt "$cmvn" ]; then
    "$bin" compute-cmvn --num_workers "$num_workers" --train_config "$train_config" \
      --data_list "$data/train/data.list" --out_cmvn "$cmvn"
  else
    echo "$cmvn is up to date" >&2
  fi
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  echo "stage 2: train" >&2
  mkdir -p "$dir"
  # One process runs `asrforge train` itself; several run it under
  # `asrforge launch` (asrforge's torchrun) with the CPU's gloo backend.
  launcher=("$bin")
  if [ "$nproc" -gt 1 ]; then
    launcher=("$bin" launch --nproc_per_node "$nproc" --master_port "$master_port")
  fi
  engine_args=(--train_engine "$train_engine")
  if [ "$train_engine" = deepspeed ]; then
    if [ -z "$deepspeed_config" ]; then
      echo "error: TRAIN_ENGINE=deepspeed needs DS_CONFIG (e.g. DS_CONFIG=../../conf/ds_stage2.json)" >&2
      exit 1
    fi
    engine_args+=(--deepspeed_config "$deepspeed_config")
  fi
  # output_dim follows the units table (the char table's 19 is in conf/train.yaml).
  token_args+=(--override_config "output_dim $(grep -c . "$dict")")
  "${launcher[@]}" train \
    --config "$train_config" \
    --data_type raw \
    --train_data "$data/train/data.list" \
    --cv_data "$data/dev/data.list" \
    --model_dir "$dir" \
    --symbol_table "$dict" \
    --num_workers "$num_workers" \
    --dist_backend gloo \
    "${engine_args[@]}" \
    "${chunk_args[@]}" \
    "${token_args[@]}" \
    --override_config "cmvn_conf.cmvn_file $cmvn" \
    --override_config "tokenizer_conf.symbol_table_path $dict"
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  echo "stage 3: average the $average_num best checkpoints by cv_loss" >&2
  "$bin" average --dst_model "$decode_checkpoint" --src_path "$dir" \
    --num "$average_num" --val_best
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  echo "stage 4: recognize ($decode_modes)" >&2
  # The trainer keeps the config it trained with beside the checkpoints, as WeNet does.
  config="$dir/train.yaml"
  [ -f "$config" ] || config="$train_config"
  for chunk in $decoding_chunk_sizes; do
    # shellcheck disable=SC2086
    "$bin" recognize \
      --config "$config" \
      --data_type raw \
      --test_data "$data/test/data.list" \
      --checkpoint "$decode_checkpoint" \
      --beam_size "$beam_size" \
      --batch_size 16 \
      --ctc_weight "$ctc_weight" \
      --attention_ctc_weight "$attention_ctc_weight" \
      --reverse_weight "$reverse_weight" \
      --decoding_chunk_size "$chunk" \
      --num_decoding_left_chunks "$num_decoding_left_chunks" \
      --symbol_table "$dict" \
      --num_workers "$num_workers" \
      --override_config "cmvn_conf.cmvn_file $cmvn" \
      --result_dir "$(result_dir_of "$chunk")" \
      --modes $decode_modes
  done
fi

if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ]; then
  echo "stage 5: score" >&2
  for chunk in $decoding_chunk_sizes; do
    res="$(result_dir_of "$chunk")"
    for mode in $decode_modes; do
      "$bin" compute-cer --char=1 --ref "$data/test/text" --hyp "$res/$mode/text" \
        > "$res/$mode/wer"
      echo "$mode (decoding_chunk_size $chunk): test CER $(tail -n 1 "$res/$mode/wer")"
    done
  done
fi
