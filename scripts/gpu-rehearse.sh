#!/usr/bin/env bash
# Rehearses the GPU session on the emulated device, before a GPU is lent:
# scripts/gpu-check.sh stages and packs exactly what would travel, then
# scripts/gpu-run.sh runs every section from that payload with
# ASRFORGE_CUDA_EMU=1 on small shapes (the tiny config, 2 x 64 frames, 3
# steps, two test binaries, one sweep value, a bench filter), so a broken
# section, a missing staged file or a table that does not parse shows here
# and not in the few minutes a GPU is lent. What needs the GPU host's own
# software (PyTorch, NCCL, compute-sanitizer) reports itself missing, as it
# must; every timing is the emulator's and means nothing. About 8 minutes
# on 2 cores; the summary is the last lines printed.
#
#   scripts/gpu-rehearse.sh            (any gpu-run.sh variable may be set to widen it)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/gpu-check.sh
export ASRFORGE_CUDA_EMU=1
export BUDGET=${BUDGET:-1200} CONFIG=${CONFIG:-$PWD/conf/tiny.yaml} STEPS=${STEPS:-3} BATCH=${BATCH:-2} FRAMES=${FRAMES:-64}
export DTYPES=${DTYPES:-"fp32 bf16"} FUSION_DTYPES=${FUSION_DTYPES:-fp32} TESTS=${TESTS:-"cuda_optim cuda_build"}
export SWEEPS=${SWEEPS:-ASRFORGE_MT_CHUNK=4096} BENCH_FILTER=${BENCH_FILTER:-"pos_enc_dropout|optim_step_200"}
exec bash scripts/gpu-run.sh
