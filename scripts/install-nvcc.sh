#!/usr/bin/env bash
# Installs nvcc 13.0 from PyPI (the recipe in DESIGN.md) into a venv under
# the user's cache dir, and prints `export NVCC=<path>` as its last line.
# Idempotent: does nothing but print when nvcc is already there. Pinned to
# 13.0 because the test GPU's driver is CUDA 13.0 and newer nvcc emits PTX
# it rejects.
set -euo pipefail
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/asrforge/nvcc-13.0"
find_nvcc() { ls "$VENV"/lib/python3*/site-packages/nvidia/cu13/bin/nvcc 2>/dev/null | head -n1; }
NVCC_PATH="$(find_nvcc || true)"
if [ -z "$NVCC_PATH" ] || [ ! -x "$NVCC_PATH" ]; then
    echo "installing nvcc 13.0 into $VENV" >&2
    PKGS="nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85"
    if python3 -m venv "$VENV" >&2; then
        # shellcheck disable=SC2086
        "$VENV/bin/pip" install --quiet --disable-pip-version-check $PKGS >&2
    else
        # No venv module (Debian without python3-venv): a plain target dir.
        echo "python3 -m venv failed; installing with pip --target instead" >&2
        # shellcheck disable=SC2086
        python3 -m pip install --quiet --disable-pip-version-check --target "$VENV/lib/python3/site-packages" $PKGS >&2
    fi
    NVCC_PATH="$(find_nvcc || true)"
    if [ -z "$NVCC_PATH" ]; then
        echo "install-nvcc.sh: pip finished but no nvcc under $VENV/lib/python3*/site-packages/nvidia/cu13/bin" >&2
        exit 1
    fi
fi
echo "export NVCC=$NVCC_PATH"
