#!/usr/bin/env python3
"""WeNet's eval-mode losses for given weights on a padded batch: the
reference numbers that tests/wenet_numerics.rs checks asrforge against
(with `encoder_conf.wenet_conv_masking: true`).

Run once, against a local WeNet checkout, with PyTorch (CPU is enough),
pyyaml and safetensors:

    python3 scripts/wenet_losses.py --wenet /path/to/wenet \
        --out tests/fixtures/wenet_losses

It reads `train.yaml` in --out, builds WeNet's ConformerEncoder,
TransformerDecoder, CTC and ASRModel from it, moves every parameter and the
batch norms' running statistics away from their initial values (seeded), and
writes into --out:

- model.safetensors: the weights under WeNet's state_dict keys, f32, without
  the positional tables (two 5000-row buffers). Those are set here to the
  sinusoid computed in float64 and rounded to float32, which is how asrforge
  builds them, so that asrforge's own tables are WeNet's to the bit;
- batch.safetensors: feats (B, T, F) zero-padded, feats_lengths, target
  (padded with -1), target_lengths;
- losses.json: loss, loss_att, loss_ctc and th_accuracy from model.forward in
  eval mode, with the torch version and the WeNet commit given.

Only WeNet's classes are imported; nothing of WeNet is copied.
"""
import argparse
import json
import math
import os
import sys


def sinusoid64(max_len, d):
    import torch
    pe = torch.zeros(max_len, d, dtype=torch.float64)
    for i in range(0, d, 2):
        a = torch.arange(max_len, dtype=torch.float64) * math.exp(-i * math.log(10000.0) / d)
        pe[:, i] = torch.sin(a)
        if i + 1 < d:
            pe[:, i + 1] = torch.cos(a)
    return pe.unsqueeze(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wenet", required=True, help="a WeNet checkout (its root, holding wenet/)")
    ap.add_argument("--out", required=True, help="the fixture folder, holding train.yaml")
    ap.add_argument("--commit", default="unknown", help="the WeNet commit, recorded in losses.json")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    sys.path.insert(0, args.wenet)
    # wenet/__init__.py pulls in the CLI (librosa, torchaudio); only the model
    # classes are needed, so the package is registered without running it.
    import types
    pkg = types.ModuleType("wenet")
    pkg.__path__ = [os.path.join(args.wenet, "wenet")]
    sys.modules["wenet"] = pkg
    # Modules WeNet imports at load time for features the losses never use
    # (whisper's language table, torchaudio's forced alignment): empty
    # stand-ins when they are not installed.
    for parent, child, attrs in (("whisper", "tokenizer", {"LANGUAGES": {}}), ("torchaudio", "functional", {})):
        try:
            __import__(f"{parent}.{child}")
        except ImportError:
            p, c = types.ModuleType(parent), types.ModuleType(f"{parent}.{child}")
            for k, v in attrs.items():
                setattr(c, k, v)
            setattr(p, child, c)
            sys.modules[parent], sys.modules[f"{parent}.{child}"] = p, c
    import torch
    import yaml
    # WeNet's squeezeformer (imported by its class tables) takes typing names
    # from torch.nn.modules.conv, which newer PyTorch no longer re-exports.
    import typing
    import torch.nn.modules.conv as _conv
    for name in ("Union", "Optional"):
        if not hasattr(_conv, name):
            setattr(_conv, name, getattr(typing, name))
    if not hasattr(_conv, "Tensor"):
        _conv.Tensor = torch.Tensor
    from safetensors.torch import save_file
    from wenet.models.transformer.asr_model import ASRModel
    from wenet.models.transformer.ctc import CTC
    from wenet.models.transformer.decoder import TransformerDecoder
    from wenet.models.transformer.encoder import ConformerEncoder

    with open(os.path.join(args.out, "train.yaml")) as f:
        cfg = yaml.safe_load(f)
    torch.manual_seed(args.seed)
    enc_conf = {k: v for k, v in cfg["encoder_conf"].items() if k != "wenet_conv_masking"}
    encoder = ConformerEncoder(cfg["input_dim"], **enc_conf)
    decoder = TransformerDecoder(cfg["output_dim"], encoder.output_size(), **cfg["decoder_conf"])
    ctc = CTC(cfg["output_dim"], encoder.output_size())
    model = ASRModel(cfg["output_dim"], encoder, decoder, ctc, **cfg["model_conf"])
    pe_keys = []
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.normal_(0.0, 0.3)
                m.running_var.uniform_(0.5, 1.5)
        for name, buf in model.named_buffers():
            if name.endswith(".pe"):
                buf.copy_(sinusoid64(buf.shape[1], buf.shape[2]).to(buf.dtype))
                pe_keys.append(name)
    model.eval()

    lens = [41, 30, 19]
    t = max(lens)
    feats = torch.zeros(len(lens), t, cfg["input_dim"])
    for b, n in enumerate(lens):
        feats[b, :n] = torch.randn(n, cfg["input_dim"])
    tlens = [5, 2, 3]
    target = torch.full((len(lens), max(tlens)), -1, dtype=torch.int64)
    for b, n in enumerate(tlens):
        target[b, :n] = torch.randint(1, cfg["output_dim"] - 1, (n,))
    batch = {
        "feats": feats,
        "feats_lengths": torch.tensor(lens, dtype=torch.int64),
        "target": target,
        "target_lengths": torch.tensor(tlens, dtype=torch.int64),
        "langs": None,
        "tasks": None,
    }
    with torch.no_grad():
        out = model(batch, torch.device("cpu"))
    losses = {k: float(out[k]) for k in ("loss", "loss_att", "loss_ctc", "th_accuracy") if out.get(k) is not None}
    losses["torch"] = torch.__version__
    losses["wenet_commit"] = args.commit
    losses["pe_keys_not_saved"] = pe_keys
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k not in pe_keys}
    save_file(state, os.path.join(args.out, "model.safetensors"))
    save_file({k: batch[k].contiguous() for k in ("feats", "feats_lengths", "target", "target_lengths")}, os.path.join(args.out, "batch.safetensors"))
    with open(os.path.join(args.out, "losses.json"), "w") as f:
        json.dump(losses, f, indent=2)
        f.write("\n")
    print(json.dumps(losses, indent=2))


if __name__ == "__main__":
    main()
