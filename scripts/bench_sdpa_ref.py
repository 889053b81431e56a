#!/usr/bin/env python3
"""PyTorch's reference for asrforge's relative-position flash attention.

Times forward + backward of WeNet's rel_selfattn scores (without rel_shift)

    s_ij = ((q_i + u)·k_j + (q_i + vb)·p_j) / sqrt(d_k)

with key padding and attention dropout 0.1, the way a PyTorch toolkit gets
them through `torch.nn.functional.scaled_dot_product_attention`: the
positional term (q + vb)·pᵀ/sqrt(d_k), with -inf at padded keys, is built
as a (B, H, T, T) tensor and passed as an explicit float `attn_mask`
("sdpa_bias"); FlashAttention cannot take such a mask, so PyTorch picks its
memory-efficient or math kernel. For scale it also times the same call
without the positional term and with a boolean padding mask ("sdpa_nobias",
what plain attention costs there), and the eager composition WeNet runs
(matmuls, masked_fill, softmax, dropout, matmul: "eager").

The shapes, lengths, dropout and FLOP count are those of asrforge's
criterion bench `flash_attention` (benches/gpu_kernels.rs): q, k, v of
(B, T, H, d_k), p of (1, T, H, d_k), u and vb of (H, d_k), key lengths
T - i·(T / 2B), and 18·B·H·T²·d_k useful FLOPs per forward + backward.
One line per (variant, shape, dtype):

    sdpa variant=sdpa_bias shape=16x128x4x64 dtype=bf16 ms=... tflops=... peak_mib=...

`--check` first compares the three variants with a float64 evaluation of
the definition (no dropout) on a small shape and exits non-zero if any
differs by more than the dtype allows; it runs on the CPU too.
"""
import argparse
import math
import sys
import time

import torch
import torch.nn.functional as F


def lengths(b, t):
    return [t - i * (t // (2 * b)) for i in range(b)]


def make_inputs(b, t, h, d, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)

    def r(*shape, std=1.0):
        return (torch.randn(*shape, generator=g) * std).to(device=device, dtype=dtype).requires_grad_()

    q, k, v, p = r(b, t, h, d), r(b, t, h, d), r(b, t, h, d), r(1, t, h, d)
    u, vb = r(h, d, std=0.1), r(h, d, std=0.1)
    lens = torch.tensor(lengths(b, t), device=device)
    pad = torch.arange(t, device=device)[None, :] >= lens[:, None]  # (B, T2): True = masked
    return q, k, v, p, u, vb, pad


def heads(x):
    # (B, T, H, d) -> (B, H, T, d)
    return x.transpose(1, 2)


def sdpa_bias(q, k, v, p, u, vb, pad, dropout):
    d = q.shape[-1]
    pb = p.expand(q.shape[0], -1, -1, -1)
    bias = torch.matmul(heads(q + vb), heads(pb).transpose(-1, -2)) / math.sqrt(d)
    bias = bias.masked_fill(pad[:, None, None, :], float("-inf"))
    o = F.scaled_dot_product_attention(heads(q + u), heads(k), heads(v), attn_mask=bias, dropout_p=dropout)
    return heads(o)


def sdpa_nobias(q, k, v, p, u, vb, pad, dropout):
    keep = ~pad[:, None, None, :]
    o = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=keep, dropout_p=dropout)
    return heads(o)


def eager(q, k, v, p, u, vb, pad, dropout):
    d = q.shape[-1]
    pb = p.expand(q.shape[0], -1, -1, -1)
    ac = torch.matmul(heads(q + u), heads(k).transpose(-1, -2))
    bd = torch.matmul(heads(q + vb), heads(pb).transpose(-1, -2))
    s = ((ac + bd) / math.sqrt(d)).masked_fill(pad[:, None, None, :], float("-inf"))
    a = torch.softmax(s, dim=-1).masked_fill(pad[:, None, None, :], 0.0)
    a = F.dropout(a, p=dropout, training=dropout > 0)
    return heads(torch.matmul(a, heads(v)))


VARIANTS = {"sdpa_bias": sdpa_bias, "sdpa_nobias": sdpa_nobias, "eager": eager}


def definition(q, k, v, p, u, vb, pad, with_pos):
    """The scores' definition in float64, no dropout (every key row has one unmasked key)."""
    q, k, v, p, u, vb = (x.detach().double().cpu() for x in (q, k, v, p, u, vb))
    b, t, h, d = q.shape
    s = torch.einsum("bihc,bjhc->bhij", q + u if with_pos else q, k)
    if with_pos:
        s = s + torch.einsum("bihc,jhc->bhij", q + vb, p[0])
    s = (s / math.sqrt(d)).masked_fill(pad.cpu()[:, None, None, :], float("-inf"))
    return torch.einsum("bhij,bjhc->bihc", torch.softmax(s, dim=-1), v)


def check(device, dtype):
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    ok = True
    for (b, t, h, d) in [(3, 37, 2, 16), (2, 64, 4, 64)]:
        x = make_inputs(b, t, h, d, dtype, device, seed=5)
        for name, f in VARIANTS.items():
            want = definition(*x, with_pos=name != "sdpa_nobias")
            got = f(*x, dropout=0.0).detach().double().cpu()
            # Padded keys only: every query row keeps its values.
            err = ((got - want).abs().max() / want.abs().max()).item()
            good = err <= tol
            ok &= good
            print(f"check variant={name} shape={b}x{t}x{h}x{d} dtype={short(dtype)} max_rel_err={err:.2e} tol={tol:g} {'ok' if good else 'FAILED'}")
    return ok


NAMES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def short(dtype):
    return next(k for k, v in NAMES.items() if v == dtype)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench(name, f, shape, dtype, device, iters, warmup, dropout):
    b, t, h, d = shape
    x = make_inputs(b, t, h, d, dtype, device, seed=13)
    params = [x[i] for i in range(6)]

    def step():
        for prm in params:
            prm.grad = None
        o = f(*x, dropout=dropout)
        o.float().sum().backward()

    for _ in range(warmup):
        step()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    ms = sorted(times)[len(times) // 2] * 1e3
    flops = 18 * b * h * t * t * d
    peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20 if device.type == "cuda" else float("nan")
    print(f"sdpa variant={name} shape={b}x{t}x{h}x{d} dtype={short(dtype)} ms={ms:.3f} tflops={flops / ms / 1e9:.2f} "
          f"extra_peak_mib={peak:.1f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--shapes", default="16x128x4x64,32x400x4x64,8x1500x8x64", help="BxTxHxD,...")
    ap.add_argument("--variants", default="sdpa_bias,sdpa_nobias,eager")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="compare with the definition first")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_sdpa_ref: --device cuda but torch.cuda.is_available() is False")
    try:
        dtypes = [NAMES[s] for s in a.dtypes.split(",")]
        shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
        variants = [(n, VARIANTS[n]) for n in a.variants.split(",")]
    except (KeyError, ValueError) as e:
        sys.exit(f"bench_sdpa_ref: bad --dtypes/--shapes/--variants ({e}); expected e.g. bf16,fp16 / 16x128x4x64 / {','.join(VARIANTS)}")
    if any(len(s) != 4 for s in shapes):
        sys.exit(f"bench_sdpa_ref: expected shapes BxTxHxD, found {a.shapes}")
    torch.manual_seed(0)
    if a.check:
        if not all([check(device, dt) for dt in dtypes]):
            sys.exit("bench_sdpa_ref: a variant differs from the definition")
    print(f"# torch {torch.__version__}, device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}", flush=True)
    for shape in shapes:
        for dt in dtypes:
            for name, f in variants:
                try:
                    bench(name, f, shape, dt, device, a.iters, a.warmup, a.dropout)
                except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
                    print(f"sdpa variant={name} shape={'x'.join(map(str, shape))} dtype={short(dt)} failed: {str(e).splitlines()[0][:120]}", flush=True)


if __name__ == "__main__":
    main()
