#!/usr/bin/env bash
# The test command: installs nvcc (scripts/install-nvcc.sh) so every CUDA
# kernel is compiled, then runs the whole test suite (GPU tests skip with a
# printed reason where no GPU is present), then runs the GPU suites again on
# the emulated device (ASRFORGE_CUDA_EMU=1: cuda/*.cu compiled by g++ and
# run on the CPU, see cuda/README.md) under two thread orders, ascending and
# seeded random. There a GPU test that cannot get its device fails instead
# of skipping (tests/common/gpu.rs), so the emulated runs skip nothing.
# With arguments (a filter, --test NAME) only the normal run is made.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --check || { echo "cargo fmt --check failed: run cargo fmt" >&2; exit 1; }
eval "$(scripts/install-nvcc.sh | tail -n1)"
echo "using NVCC=$NVCC" >&2
cargo test --release "$@"
[ $# -eq 0 ] || exit 0

# The GPU suites: the kernel tests and the Cuda(0) column of ops_grad's table,
# a training run with cv passes on Cuda(0), and the command line on Cuda(0):
# train --device cuda with cv passes and checkpoints, recognize --device cuda
# (fp32 equal to the CPU, fp16, bf16), a resume, and bench-train --device cuda
# in fp32, fp16 and bf16 against the CPU's losses (tests/gpu_cli.rs); the step
# profile and the launch signature check (tests/gpu_profile.rs); cuBLASLt's
# cached plans and BGRADB gradients (tests/cuda_blaslt.rs); the caching
# allocator's streams (tests/cuda_alloc.rs: a block another stream used is
# not reused before its event completes); the fused
# multi-tensor AdamW, bit-for-bit the per-tensor step (tests/cuda_optim.rs);
# flash attention against its composition and the CPU (tests/cuda_attention.rs);
# the fused conformer convolution module against its composition and the CPU
# (tests/cuda_conv_module.rs); the GPU engines (DDP, ZeRO-1/2) over 2 and 3 emulated devices, their
# timeouts and uneven data (tests/dist_gpu.rs); every kernel-lab variant
# against the CPU and production (tests/kernel_lab.rs).
GPU_SUITES=(--test cuda_ops --test cuda_alloc --test cuda_ops_nn --test cuda_ops_loss --test cuda_attention --test cuda_conv_module --test cuda_optim --test ops_grad --test train_gpu --test gpu_cli --test gpu_profile --test cuda_blaslt --test dist_gpu --test kernel_lab)
SEED=${ASRFORGE_EMU_SEED:-$(( $(date +%s) % 1000000 ))}
for sched in asc random; do
    echo "GPU suites on the emulated device, thread order $sched (ASRFORGE_EMU_SEED=$SEED)" >&2
    start=$(date +%s)
    ASRFORGE_CUDA_EMU=1 ASRFORGE_EMU_SCHEDULE=$sched ASRFORGE_EMU_SEED=$SEED cargo test --release "${GPU_SUITES[@]}"
    echo "GPU suites on the emulated device ($sched): $(( $(date +%s) - start )) s" >&2
done

# The build without the `cuda` feature (the stub backend): every target must
# still type-check, so the stub keeps the CUDA backend's API.
cargo check --release --no-default-features --all-targets

# The GPU benches once on the emulated device, in criterion's test mode: it
# proves they run (their timings mean something only on a GPU).
ASRFORGE_CUDA_EMU=1 cargo bench --bench gpu_kernels --bench optim -- --test
