#!/usr/bin/env python3
"""Converts an asrforge checkpoint to the .pt state dict WeNet loads.

asrforge saves models as safetensors under WeNet's state_dict key names
(`final.safetensors`, `epoch_N.safetensors`, ...). WeNet's tools
(wenet/bin/recognize.py, export_jit.py, export_onnx_*.py, average_model.py)
read a pickled `.pt` dict instead. This script, run with your own PyTorch
(asrforge itself never reads or writes pickle), writes that dict:

    pip install torch safetensors pyyaml
    python3 tools/asrforge_to_wenet.py exp/run/final.safetensors exp/run/final.pt

then, as with any WeNet model directory (asrforge writes train.yaml there):

    python3 wenet/bin/recognize.py --config exp/run/train.yaml \\
        --checkpoint exp/run/final.pt ...
    python3 wenet/bin/export_jit.py --config exp/run/train.yaml \\
        --checkpoint exp/run/final.pt --output_file final.zip

One asrforge-only key has no WeNet counterpart: if train.yaml sets
`encoder_conf.wenet_conv_masking`, delete that line before handing the file
to WeNet (its ConformerEncoder rejects unknown options). WeNet's own
masking is what `wenet_conv_masking: true` reproduces.

What it does: every tensor keeps its key and value; each batch norm gets the
`num_batches_tracked` counter PyTorch's BatchNorm1d has (0, which eval mode
ignores) when the file lacks it; `--dtype float32` casts floating tensors
(default: keep them as saved). The infos YAML beside the checkpoint
(`x.safetensors` → `x.yaml`) is copied beside the output as WeNet pairs
`x.pt` with `x.yaml` (in the same folder with the same name it is already there).

With `--wenet PATH` (a WeNet checkout) the result is also loaded into WeNet's
own model class built from `--config` with a strict load_state_dict, which
fails on any missing or unexpected key or shape.
"""
import argparse
import os
import shutil
import sys


def convert(src, dst, dtype=None):
    import torch
    from safetensors.torch import load_file

    sd = load_file(src)
    for k in list(sd):
        if k.endswith(".running_mean"):
            nbt = k[: -len("running_mean")] + "num_batches_tracked"
            sd.setdefault(nbt, torch.tensor(0, dtype=torch.int64))
    if dtype is not None:
        target = getattr(torch, dtype)
        sd = {k: v.to(target) if v.is_floating_point() else v for k, v in sd.items()}
    torch.save(sd, dst)
    infos, dst_infos = os.path.splitext(src)[0] + ".yaml", os.path.splitext(dst)[0] + ".yaml"
    # final.safetensors → final.pt in the same folder shares final.yaml.
    if os.path.exists(infos) and os.path.abspath(infos) != os.path.abspath(dst_infos):
        shutil.copyfile(infos, dst_infos)
    return sd


def check_with_wenet(wenet, config, sd):
    import yaml

    sys.path.insert(0, wenet)
    from wenet.utils.init_model import init_model

    with open(config) as f:
        configs = yaml.safe_load(f)
    args = argparse.Namespace(checkpoint=None, jit=False, use_lora=False, enc_init=None, enc_init_mods=None, train_engine="torch_ddp")
    model, _ = init_model(args, configs)
    model.load_state_dict(sd, strict=True)
    return model


def main():
    ap = argparse.ArgumentParser(description="Convert an asrforge checkpoint (safetensors) to WeNet's .pt state dict.")
    ap.add_argument("checkpoint", help="the asrforge checkpoint, e.g. exp/run/final.safetensors")
    ap.add_argument("output", help="the .pt file to write, e.g. exp/run/final.pt")
    ap.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], help="cast floating tensors (default: as saved)")
    ap.add_argument("--wenet", help="a WeNet checkout: load the result into WeNet's model (strict) to check it")
    ap.add_argument("--config", help="the model's train.yaml (with --wenet)")
    args = ap.parse_args()
    sd = convert(args.checkpoint, args.output, args.dtype)
    print(f"wrote {args.output}: {len(sd)} tensors")
    if args.wenet:
        if not args.config:
            ap.error("--wenet needs --config (the model's train.yaml)")
        check_with_wenet(args.wenet, args.config, sd)
        print("WeNet's model loaded it with strict=True")


if __name__ == "__main__":
    main()
