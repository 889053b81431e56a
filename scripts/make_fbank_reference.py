#!/usr/bin/env python3
"""Writes the fbank reference fixtures of tests/data_fbank.rs.

Makes small deterministic WAVs (a chirp with noise at 16 kHz, 16-bit; two
tones with noise at 8 kHz, 24-bit) and their features from
torchaudio.compliance.kaldi.fbank, called as WeNet's compute_fbank calls it
(waveform scaled to the int16 range, dither 0). The reference runs in float64
so it is the exact value the f32 implementation is compared against.

Needs numpy, torch, torchaudio (e.g. in a venv under /tmp: pip install torch
torchaudio numpy). Run from the repository root:
    python3 scripts/make_fbank_reference.py
"""
import json
import wave

import numpy as np
import torch
import torchaudio
import torchaudio.compliance.kaldi as kaldi

OUT = "tests/fixtures"


def write_wav(path, samples, sr, width):
    """samples in [-1, 1); width in bytes (2 or 3). Returns the integers written."""
    full = 1 << (8 * width - 1)
    ints = np.clip(np.round(samples * full), -full, full - 1).astype(np.int64)
    raw = b"".join(int(v).to_bytes(width, "little", signed=True) for v in ints)
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(width)
        w.setframerate(sr)
        w.writeframes(raw)
    return ints, full


def case(name, samples, sr, width, **opts):
    path = f"{OUT}/{name}"
    ints, full = write_wav(path, samples, sr, width)
    # What the Rust side feeds fbank: int / full (hound + scaling) times 32768.
    wav = torch.tensor(ints / full * 32768.0, dtype=torch.float64).unsqueeze(0)
    feats = kaldi.fbank(wav, dither=0.0, sample_frequency=sr, **opts)
    rows = [[float(f"{v:.8g}") for v in row] for row in feats.tolist()]
    return {"wav": name, "sample_rate": sr, **opts, "frames": len(rows), "dim": len(rows[0]), "feats": rows}


def main():
    rng = np.random.default_rng(20240601)
    sr = 16000
    t = np.arange(int(0.3 * sr)) / sr
    f0, f1 = 100.0, 6000.0
    chirp = 0.3 * np.sin(2 * np.pi * (f0 * t + (f1 - f0) / (2 * 0.3) * t * t)) + 0.02 * rng.standard_normal(t.size)
    sr8 = 8000
    t8 = np.arange(int(0.25 * sr8)) / sr8
    tones = 0.2 * np.sin(2 * np.pi * 440 * t8) + 0.1 * np.sin(2 * np.pi * 1200 * t8) + 0.01 * rng.standard_normal(t8.size)
    cases = [
        case("fbank_chirp_16k.wav", chirp, sr, 2, num_mel_bins=80, frame_length=25.0, frame_shift=10.0, energy_floor=0.0),
        case("fbank_tones_8k_24bit.wav", tones, sr8, 3, num_mel_bins=23, frame_length=20.0, frame_shift=10.0,
             energy_floor=1.0, use_energy=True),
    ]
    meta = {"torch": torch.__version__, "torchaudio": torchaudio.__version__, "cases": cases}
    with open(f"{OUT}/fbank_reference.json", "w") as f:
        json.dump(meta, f)


if __name__ == "__main__":
    main()
