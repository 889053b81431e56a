#!/usr/bin/env python3
"""Synthesises the spoken-digits corpus with espeak-ng and sox.

Each utterance is 1-5 random digit words ("THREE ONE FOUR") spoken by one of
several espeak-ng voices and variants at a random speed and pitch, converted
to 16 kHz 16-bit mono. Writes DATA/{train,dev,test}/{wavs/,data.list,text}
and DATA/dict/units.txt (char units, WeNet layout). Deterministic for a seed.
Speakers (voice + variant) of dev/test are partly unseen in train.
"""
import argparse
import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

WORDS = ["ZERO", "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE"]
VOICES = ["en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-029"]
VARIANTS = ["", "+m1", "+m3", "+m5", "+f1", "+f2", "+f4"]
HELD_OUT = {("en-029", "+f4"), ("en-gb-scotland", "+m5")}


def speakers(split):
    all_spk = [(v, x) for v in VOICES for x in VARIANTS]
    if split == "train":
        return [s for s in all_spk if s not in HELD_OUT]
    return all_spk


def synth(job):
    key, text, voice, speed, pitch, out = job
    raw = out + ".22k.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", raw, text.lower()],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(["sox", raw, "-r", "16000", "-b", "16", "-c", "1", out], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.remove(raw)
    return key


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="data")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--train", type=int, default=1500)
    p.add_argument("--dev", type=int, default=100)
    p.add_argument("--test", type=int, default=100)
    p.add_argument("--jobs", type=int, default=2)
    a = p.parse_args()
    rng = random.Random(a.seed)
    chars = set()
    for split, n in [("train", a.train), ("dev", a.dev), ("test", a.test)]:
        wavdir = os.path.abspath(os.path.join(a.data, split, "wavs"))
        os.makedirs(wavdir, exist_ok=True)
        jobs, lines, texts = [], [], []
        spk = speakers(split)
        for i in range(n):
            words = [rng.choice(WORDS) for _ in range(rng.randint(1, 5))]
            text = " ".join(words)
            voice, variant = rng.choice(spk)
            speed, pitch = rng.randint(130, 200), rng.randint(25, 75)
            key = f"{split}_{i:05d}_{voice}{variant.replace('+', '_')}"
            wav = os.path.join(wavdir, key + ".wav")
            jobs.append((key, text, voice + variant, speed, pitch, wav))
            lines.append(json.dumps({"key": key, "wav": wav, "txt": text}))
            texts.append(f"{key} {text}")
            if split == "train":
                chars.update(text.replace(" ", "\u2581"))
        with ThreadPoolExecutor(max_workers=a.jobs) as ex:
            for _ in ex.map(synth, jobs):
                pass
        with open(os.path.join(a.data, split, "data.list"), "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(a.data, split, "text"), "w") as f:
            f.write("\n".join(texts) + "\n")
        print(f"{split}: {n} utterances in {wavdir}", file=sys.stderr)
    os.makedirs(os.path.join(a.data, "dict"), exist_ok=True)
    units = ["<blank>", "<unk>"] + sorted(chars) + ["<sos/eos>"]
    with open(os.path.join(a.data, "dict", "units.txt"), "w") as f:
        f.write("".join(f"{u} {i}\n" for i, u in enumerate(units)))
    print(f"dict: {len(units)} units", file=sys.stderr)


if __name__ == "__main__":
    main()
