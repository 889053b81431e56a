#!/usr/bin/env python3
"""Character error rate split by whether the reference repeats a word.

Usage: local/cer_by_repeats.py REF_TEXT HYP_TEXT [HYP_TEXT ...]

Both files hold `key WORD WORD ...` lines (Kaldi text). Characters are
compared without spaces, as `asrforge compute-cer --char=1` does, and each
hypothesis file gets one line: the CER over all utterances, over those whose
reference says some word twice or more ("THREE ONE THREE"), and over the
rest. A missing hypothesis counts as empty. An attention decoder that cannot
tell two spoken copies of a word apart fails almost only in the first group.
"""
import sys


def edit_distance(a, b):
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        prev, row[0] = row[:], i
        for j in range(1, len(b) + 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
    return row[len(b)]


def read_text(path):
    out = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if parts[0] in out:
                sys.exit(f"error: {path}:{n}: key {parts[0]} appears twice")
            out[parts[0]] = parts[1:]
    return out


def rate(errors, chars):
    return f"{100.0 * errors / chars:.2f} % ({errors}/{chars})" if chars else "n/a"


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: cer_by_repeats.py REF_TEXT HYP_TEXT [HYP_TEXT ...]")
    ref = read_text(sys.argv[1])
    for hyp_path in sys.argv[2:]:
        hyp = read_text(hyp_path)
        # [errors, chars, utterances] for references with / without a repeated word.
        groups = {True: [0, 0, 0], False: [0, 0, 0]}
        for key, words in ref.items():
            g = groups[len(set(words)) < len(words)]
            r, h = "".join(words), "".join(hyp.get(key, []))
            g[0] += edit_distance(r, h)
            g[1] += len(r)
            g[2] += 1
        rep, single = groups[True], groups[False]
        print(
            f"{hyp_path}: all {rate(rep[0] + single[0], rep[1] + single[1])}"
            f" | repeated word ({rep[2]} utts) {rate(rep[0], rep[1])}"
            f" | no repeat ({single[2]} utts) {rate(single[0], single[1])}"
        )


if __name__ == "__main__":
    main()
