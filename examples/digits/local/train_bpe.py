#!/usr/bin/env python3
"""Trains the recipe's sentencepiece model and writes its units.txt.

Usage (from examples/digits):
  python3 local/train_bpe.py --text data/train/text --nbpe 30 --mode unigram --out data/dict

Reads `key TRANSCRIPT` lines, trains a sentencepiece model of `--nbpe` pieces
on the transcripts (`--out/bpe_<mode><nbpe>.model`), then writes
`--out/units_<mode><nbpe>.txt` in WeNet's layout: `<blank> 0`, `<unk> 1`,
the sorted pieces of the encoded training text, `<sos/eos>` last.
sentencepiece is pip-installed into ~/.cache/asrforge/spm-venv (never into
the repository) and the script re-runs itself there.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "scripts"))
from spm_venv import ensure_sentencepiece  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", required=True, help="key TRANSCRIPT lines")
    ap.add_argument("--nbpe", type=int, default=30)
    ap.add_argument("--mode", default="unigram", choices=["unigram", "bpe"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    ensure_sentencepiece()
    import sentencepiece as spm

    with open(args.text, encoding="utf-8") as f:
        lines = [l.split(maxsplit=1)[1].strip() for l in f if len(l.split(maxsplit=1)) == 2]
    os.makedirs(args.out, exist_ok=True)
    name = f"{args.mode}{args.nbpe}"
    corpus = os.path.join(args.out, f"input_{name}.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    prefix = os.path.join(args.out, f"bpe_{name}")
    spm.SentencePieceTrainer.train(input=corpus, model_prefix=prefix, vocab_size=args.nbpe,
                                   model_type=args.mode, character_coverage=1.0,
                                   hard_vocab_limit=False, num_threads=1, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    pieces = sorted({p for l in lines for p in sp.encode_as_pieces(l.upper())})
    rows = ["<blank> 0", "<unk> 1"] + [f"{p} {i + 2}" for i, p in enumerate(pieces)]
    rows.append(f"<sos/eos> {len(pieces) + 2}")
    units = os.path.join(args.out, f"units_{name}.txt")
    with open(units, "w", encoding="utf-8") as f:
        f.write("\n".join(rows) + "\n")
    print(f"{prefix}.model ({sp.get_piece_size()} pieces), {units} ({len(rows)} units)", file=sys.stderr)


if __name__ == "__main__":
    main()
