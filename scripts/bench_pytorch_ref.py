"""The PyTorch side of scripts/bench-vs-pytorch.sh: a compact conformer
(conv2d subsampling /4, relative-position attention without rel_shift,
macaron FFNs, convolution module with batch norm) with a transformer
decoder, CTC (weight 0.3) + label-smoothed attention loss (0.1), Adam and
gradient clipping: the same model asrforge builds from the same config
keys, written for this comparison. It asserts the parameter count equals
asrforge's and times training steps on the batch shapes asrforge's
bench-train uses (the same lengths; the values are drawn independently).

Prints one line: `pytorch params=N step_ms_median=.. step_ms_min=.. step_ms_max=.. timed_steps=..`.
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml


def lengths(batch, frames):
    # bench-train's synthetic_batch: frames down to 3/4 of it; one token per 40 frames.
    div = max(max(batch, 2) - 1, 1)
    lens = [frames - (frames // 4) * i // div for i in range(batch)]
    return lens, [max(l // 40, 1) for l in lens]


class FFN(nn.Module):
    def __init__(s, d, units, p, act):
        super().__init__()
        s.w_1, s.w_2, s.dropout, s.act = nn.Linear(d, units), nn.Linear(units, d), nn.Dropout(p), act

    def forward(s, x):
        return s.w_2(s.dropout(s.act(s.w_1(x))))


class MHA(nn.Module):
    def __init__(s, h, d, p, rel):
        super().__init__()
        s.h, s.dk = h, d // h
        s.linear_q, s.linear_k, s.linear_v, s.linear_out = (nn.Linear(d, d) for _ in range(4))
        s.dropout = nn.Dropout(p)
        if rel:
            s.linear_pos = nn.Linear(d, d, bias=False)
            s.pos_bias_u = nn.Parameter(torch.empty(h, s.dk).uniform_(-0.1, 0.1))
            s.pos_bias_v = nn.Parameter(torch.empty(h, s.dk).uniform_(-0.1, 0.1))

    def forward(s, q, k, v, mask, pos=None):
        b = q.size(0)
        q = s.linear_q(q).view(b, -1, s.h, s.dk)
        k = s.linear_k(k).view(b, -1, s.h, s.dk).transpose(1, 2)
        v = s.linear_v(v).view(b, -1, s.h, s.dk).transpose(1, 2)
        if pos is None:
            scores = torch.matmul(q.transpose(1, 2), k.transpose(-2, -1))
        else:
            p = s.linear_pos(pos).view(pos.size(0), -1, s.h, s.dk).transpose(1, 2)
            ac = torch.matmul((q + s.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))
            bd = torch.matmul((q + s.pos_bias_v).transpose(1, 2), p.transpose(-2, -1))
            scores = ac + bd
        scores = (scores / math.sqrt(s.dk)).masked_fill(mask, -float("inf"))
        attn = torch.softmax(scores, dim=-1).masked_fill(mask, 0.0)
        x = torch.matmul(s.dropout(attn), v).transpose(1, 2).reshape(b, -1, s.h * s.dk)
        return s.linear_out(x)


class ConvModule(nn.Module):
    def __init__(s, c, k):
        super().__init__()
        s.pointwise_conv1 = nn.Conv1d(c, 2 * c, 1)
        s.depthwise_conv = nn.Conv1d(c, c, k, padding=(k - 1) // 2, groups=c)
        s.norm = nn.BatchNorm1d(c)
        s.pointwise_conv2 = nn.Conv1d(c, c, 1)

    def forward(s, x, pad):
        x = x.transpose(1, 2).masked_fill(pad, 0.0)
        x = F.glu(s.pointwise_conv1(x), dim=1).masked_fill(pad, 0.0)
        x = s.pointwise_conv2(F.silu(s.norm(s.depthwise_conv(x))))
        return x.masked_fill(pad, 0.0).transpose(1, 2)


class ConformerLayer(nn.Module):
    def __init__(s, d, h, units, k, p):
        super().__init__()
        s.self_attn = MHA(h, d, 0.0, rel=True)
        s.feed_forward, s.feed_forward_macaron = FFN(d, units, p, F.silu), FFN(d, units, p, F.silu)
        s.conv_module = ConvModule(d, k)
        s.norm_ff, s.norm_mha, s.norm_ff_macaron, s.norm_conv, s.norm_final = (nn.LayerNorm(d, eps=1e-5) for _ in range(5))
        s.dropout = nn.Dropout(p)

    def forward(s, x, mask, pos, pad):
        x = x + 0.5 * s.dropout(s.feed_forward_macaron(s.norm_ff_macaron(x)))
        h = s.norm_mha(x)
        x = x + s.dropout(s.self_attn(h, h, h, mask, pos))
        x = x + s.dropout(s.conv_module(s.norm_conv(x), pad))
        x = x + 0.5 * s.dropout(s.feed_forward(s.norm_ff(x)))
        return s.norm_final(x)


class DecoderLayer(nn.Module):
    def __init__(s, d, h, units, p):
        super().__init__()
        s.self_attn, s.src_attn = MHA(h, d, 0.0, rel=False), MHA(h, d, 0.0, rel=False)
        s.feed_forward = FFN(d, units, p, F.relu)
        s.norm1, s.norm2, s.norm3 = (nn.LayerNorm(d, eps=1e-5) for _ in range(3))
        s.dropout = nn.Dropout(p)

    def forward(s, x, tmask, mem, mmask):
        h = s.norm1(x)
        x = x + s.dropout(s.self_attn(h, h, h, tmask))
        h = s.norm2(x)
        x = x + s.dropout(s.src_attn(h, mem, mem, mmask))
        return x + s.dropout(s.feed_forward(s.norm3(x)))


def sinusoid(t, d):
    pos = torch.arange(t, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * -(math.log(10000.0) / d))
    pe = torch.zeros(t, d)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
    return pe.unsqueeze(0)


class AsrModel(nn.Module):
    def __init__(s, cfg):
        super().__init__()
        e, dc = cfg["encoder_conf"], cfg["decoder_conf"]
        d, idim, s.vocab = e["output_size"], cfg["input_dim"], cfg["output_dim"]
        p = e.get("dropout_rate", 0.1)
        s.d, s.p = d, p
        s.conv = nn.Sequential(nn.Conv2d(1, d, 3, 2), nn.ReLU(), nn.Conv2d(d, d, 3, 2), nn.ReLU())
        f = ((idim - 1) // 2 - 1) // 2
        s.embed_out = nn.Linear(d * f, d)
        s.encoders = nn.ModuleList(ConformerLayer(d, e["attention_heads"], e["linear_units"], e["cnn_module_kernel"], p) for _ in range(e["num_blocks"]))
        s.after_norm = nn.LayerNorm(d, eps=1e-5)
        s.ctc_lo = nn.Linear(d, s.vocab)
        s.embed = nn.Embedding(s.vocab, d)
        s.decoders = nn.ModuleList(DecoderLayer(d, dc["attention_heads"], dc["linear_units"], dc.get("dropout_rate", 0.1)) for _ in range(dc["num_blocks"]))
        s.dec_norm = nn.LayerNorm(d, eps=1e-5)
        s.output_layer = nn.Linear(d, s.vocab)
        s.drop = nn.Dropout(p)

    def forward(s, feats, lens, ys_in, ys_out, tlens):
        x = s.conv(feats.unsqueeze(1))
        b, c, t, f = x.shape
        x = s.embed_out(x.transpose(1, 2).reshape(b, t, c * f))
        elens = torch.tensor([((l - 1) // 2 - 1) // 2 for l in lens])
        pos = s.drop(sinusoid(t, s.d))
        x = s.drop(x * math.sqrt(s.d))
        pad = (torch.arange(t).unsqueeze(0) >= elens.unsqueeze(1)).unsqueeze(1)  # (B, 1, T)
        mask = pad.unsqueeze(1)  # (B, 1, 1, T)
        for layer in s.encoders:
            x = layer(x, mask, pos, pad)
        enc = s.after_norm(x)
        # CTC, summed and divided by the batch size.
        lp = F.log_softmax(s.ctc_lo(enc), dim=-1).transpose(0, 1)
        targets = torch.cat([ys_out[i, : tlens[i]] for i in range(b)])
        ctc = F.ctc_loss(lp, targets, elens, torch.tensor(tlens), blank=0, reduction="sum", zero_infinity=True) / b
        # The decoder: sos + tokens in, tokens + eos out.
        l = ys_in.size(1)
        dlens = torch.tensor([n + 1 for n in tlens])
        tmask = (torch.arange(l).unsqueeze(0) >= dlens.unsqueeze(1)).unsqueeze(1) | torch.triu(torch.ones(l, l, dtype=torch.bool), 1)
        y = s.drop(s.embed(ys_in) * math.sqrt(s.d) + sinusoid(l, s.d))
        for layer in s.decoders:
            y = layer(y, tmask.unsqueeze(1), enc, mask)
        logits = s.output_layer(s.dec_norm(y))
        att = label_smoothing(logits, ys_out, 0.1) / b
        return 0.3 * ctc + 0.7 * att


def label_smoothing(logits, target, eps):
    v = logits.size(-1)
    logits, target = logits.reshape(-1, v), target.reshape(-1)
    ignore = target == -1
    t = target.masked_fill(ignore, 0)
    dist = torch.full_like(logits, eps / (v - 1)).scatter_(1, t.unsqueeze(1), 1.0 - eps)
    kl = F.kl_div(F.log_softmax(logits, dim=-1), dist, reduction="none").sum(1)
    return kl.masked_fill(ignore, 0.0).sum()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--override", action="append", default=[], help="KEY VALUE, as asrforge's --override_config")
    ap.add_argument("--batch_size", type=int, default=16)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--params", type=int, default=0, help="asrforge's parameter count, asserted")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "tf32", "fp16", "bf16"],
                    help="fp16/bf16: torch.autocast (fp16 with a GradScaler); tf32: f32 with TF32 matmuls and convs")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(777)
    if a.device == "cuda":
        # Every factory call in the model (masks, positions, lengths) then lands on the GPU.
        torch.set_default_device("cuda")
    tf32 = a.dtype == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(a.dtype)
    scaler = torch.amp.GradScaler("cuda") if a.dtype == "fp16" and a.device == "cuda" else None
    cfg = yaml.safe_load(open(a.config))
    for o in a.override:
        key, val = o.split(None, 1)
        node = cfg
        *path, last = key.split(".")
        for k in path:
            node = node[k]
        node[last] = yaml.safe_load(val)
    model = AsrModel(cfg)
    n = sum(p.numel() for p in model.parameters())
    if a.params:
        assert n == a.params, f"parameter count: PyTorch reference {n}, asrforge {a.params}"
    v = cfg["output_dim"]
    lens, tlens = lengths(a.batch_size, a.frames)
    feats = torch.zeros(a.batch_size, a.frames, cfg["input_dim"])
    for i, l in enumerate(lens):
        feats[i, :l] = torch.randn(l, cfg["input_dim"])
    lmax = max(tlens) + 1
    ys_in = torch.full((a.batch_size, lmax), v - 1, dtype=torch.long)
    ys_out = torch.full((a.batch_size, lmax), -1, dtype=torch.long)
    for i, tl in enumerate(tlens):
        tok = torch.randint(2, v - 1, (tl,))
        ys_in[i, 1 : tl + 1] = tok
        ys_out[i, :tl] = tok
        ys_out[i, tl] = v - 1
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    model.train()
    times = []
    for step in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=half, enabled=half is not None):
            loss = model(feats, lens, ys_in, ys_out, tlens)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.get("grad_clip", 5.0))
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.get("grad_clip", 5.0))
            opt.step()
        last = loss.item()  # waits for the step, on the GPU too
        if step >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(times)
    peak = torch.cuda.max_memory_allocated() / 2**20 if a.device == "cuda" else float("nan")
    print(
        f"pytorch device={a.device} dtype={a.dtype} params={n} last_loss={last:.6f} frames_per_s={sum(lens) / (med / 1e3):.1f} "
        f"step_ms_median={med:.1f} step_ms_min={min(times):.1f} "
        f"step_ms_max={max(times):.1f} timed_steps={len(times)} peak_mib={peak:.1f} torch={torch.__version__} threads={torch.get_num_threads()}"
    )


if __name__ == "__main__":
    main()
