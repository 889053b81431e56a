#!/usr/bin/env python3
"""Makes the sentencepiece fixtures of tests/sentencepiece.rs.

Trains small sentencepiece models on tests/fixtures/spm/train.txt and writes,
for every sentence of tests/fixtures/spm/sentences.txt, the pieces and ids
that sentencepiece itself gives (tests/fixtures/spm/expected.json), plus each
model's units.txt in WeNet's layout and the tokens of WeNet's BpeTokenizer
rules (text upper-cased, non-language symbols kept whole, CJK characters
split out, the rest through encode_as_pieces).

sentencepiece is installed with pip into a virtual environment under
~/.cache/asrforge/spm-venv (never into the repository); the script re-runs
itself there. Run from anywhere: python3 scripts/make_spm_fixtures.py
"""

import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spm_venv import ensure_sentencepiece  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "spm")


# The models: name -> sentencepiece trainer options.
MODELS = {
    "unigram": dict(model_type="unigram", vocab_size=150, character_coverage=1.0,
                    hard_vocab_limit=False),
    "bpe": dict(model_type="bpe", vocab_size=150, character_coverage=1.0),
    # Byte fallback and a user-defined symbol; most characters covered by bytes.
    "unigram_bytes": dict(model_type="unigram", vocab_size=320, character_coverage=0.98,
                          byte_fallback=True, user_defined_symbols=["<NOISE>"],
                          hard_vocab_limit=False),
    # No normalisation rules (a small file: the parser property tests mutate it).
    "bpe_identity": dict(model_type="bpe", vocab_size=150, character_coverage=1.0,
                         normalization_rule_name="identity"),
}

NON_LANG = ["<NOISE>"]
CJK = re.compile(r"([\u4e00-\u9fff])")
BRACKETED = re.compile(r"(\[[^\[\]]+\]|<[^<>]+>|{[^{}]+})")


def wenet_bpe_tokens(sp, line):
    """WeNet's BpeTokenizer.text2tokens rules (with a non-language symbol list)."""
    line = line.strip()
    parts = [p for p in BRACKETED.split(line.upper()) if len(p.strip()) > 0]
    tokens = []
    for part in parts:
        if part in NON_LANG:
            tokens.append(part)
            continue
        for chunk in CJK.split(part.upper()):
            if len(chunk.strip()) == 0:
                continue
            if CJK.fullmatch(chunk):
                tokens.append(chunk)
            else:
                tokens.extend(sp.encode_as_pieces(chunk))
    return tokens


def units_txt(sp, text_lines):
    """units.txt as WeNet's recipes build it: <blank> 0, <unk> 1, the sorted
    pieces of the encoded training text, <sos/eos> last."""
    pieces = sorted({p for line in text_lines for p in sp.encode_as_pieces(line.upper())})
    pieces = [p for p in pieces if p not in ("<blank>", "<unk>", "<sos/eos>")]
    rows = ["<blank> 0", "<unk> 1"] + [f"{p} {i + 2}" for i, p in enumerate(pieces)]
    rows.append(f"<sos/eos> {len(pieces) + 2}")
    return "\n".join(rows) + "\n"


def main():
    ensure_sentencepiece()
    import sentencepiece as spm

    train = os.path.join(OUT, "train.txt")
    with open(train, encoding="utf-8") as f:
        train_lines = [l.rstrip("\n") for l in f if l.strip()]
    with open(os.path.join(OUT, "sentences.txt"), encoding="utf-8") as f:
        sentences = [l.rstrip("\n") for l in f]
    expected = {"sentencepiece_version": spm.__version__, "non_lang_syms": NON_LANG, "models": {}}
    for name, opts in MODELS.items():
        prefix = os.path.join(OUT, name)
        spm.SentencePieceTrainer.train(input=train, model_prefix=prefix, num_threads=1,
                                       minloglevel=2, **opts)
        os.remove(prefix + ".vocab")
        sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
        with open(prefix + ".units.txt", "w", encoding="utf-8") as f:
            f.write(units_txt(sp, train_lines))
        cases = []
        for s in sentences:
            cases.append({
                "text": s,
                "pieces": sp.encode_as_pieces(s),
                "ids": sp.encode_as_ids(s),
                "normalized": sp.normalize(s),
                "wenet_tokens": wenet_bpe_tokens(sp, s),
            })
        expected["models"][name] = {"model": f"{name}.model", "units": f"{name}.units.txt", "cases": cases}
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {', '.join(MODELS)} with {len(sentences)} sentences each")


if __name__ == "__main__":
    main()
