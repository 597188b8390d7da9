#!/usr/bin/python3
"""bench/train/peer_torch.py - PyTorch CPU peer of bench/train/bench_train.c.

Run it with Debian's /usr/bin/python3 (python3-torch), not a venv's python:
    OPENBLAS_NUM_THREADS=2 /usr/bin/python3 bench/train/peer_torch.py --threads 2

The same models gradd trains, written in plain PyTorch, fp32:
  gpt   GPT-2: learned position embeddings, pre-norm blocks (ln_1, causal
        self-attention with c_attn/c_proj, ln_2, MLP c_fc/GELU(tanh)/c_proj),
        ln_f, output tied to wte; biases on every Linear, layernorm eps 1e-5,
        no dropout; mean cross-entropy over all tokens.
  llama Llama: RMSNorm (eps 1e-5), q/k/v in one Linear with fewer K/V heads
        (GQA), rotary embeddings (theta 10000, rotate-half as Hugging Face),
        gate and up in one Linear, SwiGLU, no biases, final norm, output tied
        to the embedding; the K/V heads are repeated for each group of query
        heads before attention, as transformers does.
  mlp   784 -> 512 -> 256 -> 10 with ReLU, mean cross-entropy.
One training step, timed from before the batch is picked to after the
optimizer step: zero_grad(set_to_none=True), forward, backward,
clip_grad_norm_(1.0) (gradd computes the global norm and clips every step
too), torch.optim.AdamW(lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay
0.1 on tensors of 2+ dims only, as gradd).

Threads: --threads N is the core count both sides get.  OpenBLAS, which
runs torch's GEMMs, takes its thread count from OPENBLAS_NUM_THREADS (set it
to N; bench/train/run.sh does); torch.set_num_threads sets the OpenMP
team of torch's own kernels.  With N OpenBLAS pthreads and N spinning OpenMP
workers on N cores the two pools fight (libgomp spins after every parallel
region), so --torch-threads auto (the default) also tries
torch.set_num_threads(1) - GEMMs still on N OpenBLAS threads - and keeps the
faster; on this 2-core machine that is usually 1 for gpt_small and the MLP.

Attention: --attn auto (the default) times both implementations torch 1.13
has on CPU for a few steps and keeps the faster: "explicit" (q@kᵀ, causal
masked_fill, softmax, @v; what gradd computes) and "sdpa"
(torch.nn.functional._scaled_dot_product_attention, the private 1.13
precursor of F.scaled_dot_product_attention, which 1.13 does not have).  Likewise
--foreach auto picks the faster of AdamW's for-loop and foreach paths.  The
search is coordinate-wise (threads, then attention, then foreach) over a few
steps each; the choices are printed with the figure.

Output: one JSON object per configuration on stdout,
  {"bench":"train_gpt_tiny","metric":"step_ms","value":...,"unit":"ms",
   "impl":"pytorch-1.13.0a0-cpu","threads":2,...}
Figure: median ms per step over --steps steps after --warmup steps.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {
    # name: (kind, shape, batch, warmup, steps)
    "gpt_tiny": ("gpt", dict(L=2, C=64, H=4, T=64, V=256), 4, 20, 200),
    "gpt_small": ("gpt", dict(L=6, C=384, H=6, T=256, V=256), 8, 3, 15),
    "llama_small": ("llama", dict(L=6, C=384, H=6, KVH=2, F=1024, T=256, V=256), 8, 3, 15),
    "mlp": ("mlp", dict(hidden=(512, 256), inputs=784, classes=10), 128, 20, 300),
}


def causal_attention(q, k, v, impl, mask):
    """Causal softmax attention of (B, H, T, hs) tensors."""
    if impl == "sdpa":
        y, _ = F._scaled_dot_product_attention(q, k, v, None, 0.0, False, True)
        return y
    T = q.shape[2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    att = att.masked_fill(mask[:T, :T], float("-inf"))
    return F.softmax(att, dim=-1) @ v


class Block(nn.Module):
    def __init__(self, C, H, T, attn):
        super().__init__()
        self.H = H
        self.attn_impl = attn
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).triu(1), persistent=False)

    def attention(self, x):
        B, T, C = x.shape
        H = self.H
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, H, C // H).transpose(1, 2)
        k = k.view(B, T, H, C // H).transpose(1, 2)
        v = v.view(B, T, H, C // H).transpose(1, 2)
        y = causal_attention(q, k, v, self.attn_impl, self.mask)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.attn_proj(y)

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, L, C, H, T, V, attn):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, H, T, attn) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        self.register_buffer("pos", torch.arange(T), persistent=False)
        # GPT-2 initialisation, as gradd's (timing does not depend on it).
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            elif "ln_" in name:
                nn.init.ones_(p)
            else:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def set_attn(self, attn):
        for b in self.h:
            b.attn_impl = attn

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(self.pos[:T])
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied output embedding, no bias
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, C, H, KVH, F_, T, attn):
        super().__init__()
        self.H, self.KVH, self.hs, self.F = H, KVH, C // H, F_
        self.attn_impl = attn
        self.input_norm = RMSNorm(C, 1e-5)
        self.qkv = nn.Linear(C, (H + 2 * KVH) * self.hs, bias=False)
        self.o_proj = nn.Linear(C, C, bias=False)
        self.post_norm = RMSNorm(C, 1e-5)
        self.gate_up = nn.Linear(C, 2 * F_, bias=False)
        self.down_proj = nn.Linear(F_, C, bias=False)
        self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).triu(1), persistent=False)

    def attention(self, x, cos, sin):
        B, T, C = x.shape
        H, KVH, hs = self.H, self.KVH, self.hs
        q, k, v = self.qkv(x).split([H * hs, KVH * hs, KVH * hs], dim=2)
        q = q.view(B, T, H, hs).transpose(1, 2)
        k = k.view(B, T, KVH, hs).transpose(1, 2)
        v = v.view(B, T, KVH, hs).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KVH, dim=1)
        v = v.repeat_interleave(H // KVH, dim=1)
        y = causal_attention(q, k, v, self.attn_impl, self.mask)
        return self.o_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x, cos, sin):
        x = x + self.attention(self.input_norm(x), cos, sin)
        gate, up = self.gate_up(self.post_norm(x)).split(self.F, dim=2)
        return x + self.down_proj(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, L, C, H, KVH, F, T, V, attn):
        super().__init__()
        self.embed = nn.Embedding(V, C)
        self.layers = nn.ModuleList([LlamaBlock(C, H, KVH, F, T, attn) for _ in range(L)])
        self.norm = RMSNorm(C, 1e-5)
        hs = C // H
        inv = 1.0 / (10000.0 ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
        ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def set_attn(self, attn):
        for b in self.layers:
            b.attn_impl = attn

    def forward(self, idx, targets):
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.embed(idx)
        for block in self.layers:
            x = block(x, cos, sin)
        logits = F.linear(self.norm(x), self.embed.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


class MLP(nn.Module):
    def __init__(self, inputs, hidden, classes):
        super().__init__()
        dims = (inputs,) + tuple(hidden) + (classes,)
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:])])

    def forward(self, x, y):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return F.cross_entropy(x, y)


def make_optimizer(model, foreach):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, foreach=foreach)


def make_batches(kind, shape, batch, gen):
    """A callable returning the next (x, y): random windows of a byte corpus
    (gpt) or random rows of an image set (mlp), picked inside the timed step
    as gradd's data stream is."""
    if kind in ("gpt", "llama"):
        T = shape["T"]
        data = torch.randint(0, shape["V"], (1 << 20,), generator=gen, dtype=torch.long)
        offs = torch.arange(T + 1)

        def nxt():
            starts = torch.randint(0, data.numel() - T - 1, (batch, 1), generator=gen)
            win = data[starts + offs]
            return win[:, :-1], win[:, 1:].contiguous()
    else:
        images = torch.rand(10000, shape["inputs"], generator=gen)
        labels = torch.randint(0, shape["classes"], (10000,), generator=gen)

        def nxt():
            i = torch.randint(0, images.shape[0], (batch,), generator=gen)
            return images[i], labels[i]
    return nxt


def time_steps(model, opt, nxt, n):
    params = [p for p in model.parameters()]
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        x, y = nxt()
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    return times, float(loss)


def run_config(name, args):
    kind, shape, batch, warmup, steps = CONFIGS[name]
    warmup = args.warmup if args.warmup is not None else warmup
    steps = args.steps if args.steps is not None else steps
    gen = torch.Generator().manual_seed(1337)
    torch.manual_seed(1337)
    if kind == "gpt":
        model = GPT(attn="explicit", **shape)
    elif kind == "llama":
        model = Llama(attn="explicit", **shape)
    else:
        model = MLP(shape["inputs"], shape["hidden"], shape["classes"])
    nxt = make_batches(kind, shape, batch, gen)

    # Coordinate search for the fastest variant, a few steps each (after one
    # warmup step): intra-op threads, then attention, then AdamW's foreach.
    choices = {
        "threads": [args.threads, 1] if args.torch_threads == "auto" and args.threads > 1
        else [args.threads if args.torch_threads == "auto" else int(args.torch_threads)],
        "attn": (["sdpa", "explicit"] if args.attn == "auto" else [args.attn]) if kind != "mlp" else ["-"],
        "foreach": [True, False] if args.foreach == "auto" else [args.foreach == "on"],
    }
    pick = {key: vals[0] for key, vals in choices.items()}
    trial = max(2, min(steps, 3 if kind != "mlp" and shape["C"] >= 256 else 5))
    tried = {}

    def apply(v):
        torch.set_num_threads(v["threads"])
        if kind != "mlp":
            model.set_attn(v["attn"])
        return make_optimizer(model, v["foreach"])

    for key, vals in choices.items():
        if len(vals) < 2:
            continue
        best = None
        for val in vals:
            v = dict(pick, **{key: val})
            sig = tuple(sorted(v.items()))
            if sig not in tried:
                opt = apply(v)
                time_steps(model, opt, nxt, 1)
                t, _ = time_steps(model, opt, nxt, trial)
                tried[sig] = statistics.median(t)
                print(f"peer_torch: {name} threads={v['threads']} attn={v['attn']} foreach={v['foreach']}: "
                      f"{tried[sig]:.3f} ms/step (trial of {trial})", file=sys.stderr)
            if best is None or tried[sig] < best[0]:
                best = (tried[sig], val)
        pick[key] = best[1]
    attn, foreach, tthreads = pick["attn"], pick["foreach"], pick["threads"]
    torch.set_num_threads(tthreads)
    if kind != "mlp":
        model.set_attn(attn)
    opt = make_optimizer(model, foreach)
    time_steps(model, opt, nxt, warmup)
    times, loss = time_steps(model, opt, nxt, steps)
    med = statistics.median(times)
    impl = f"pytorch-{torch.__version__}-cpu"
    print(f"peer_torch: {name:10s} torch {med:9.3f} ms/step (min {min(times):9.3f}, max {max(times):9.3f}), "
          f"threads={tthreads} attn={attn} foreach={foreach}, loss {loss:.4f}", file=sys.stderr)
    rec = {"bench": f"train_{name}", "metric": "step_ms", "value": round(med, 4), "unit": "ms", "impl": impl,
           "threads": args.threads, "torch_threads": torch.get_num_threads(), "warmup": warmup, "steps": steps, "min_ms": round(min(times), 4),
           "max_ms": round(max(times), 4), "attn": attn, "foreach": foreach, "final_loss": round(loss, 6),
           "blas_threads_env": os.environ.get("OPENBLAS_NUM_THREADS", "")}
    print(json.dumps(rec, separators=(",", ":")), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default=",".join(CONFIGS))
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--attn", choices=["auto", "explicit", "sdpa"], default="auto")
    ap.add_argument("--torch-threads", default="auto",
                    help="torch.set_num_threads: auto (the faster of --threads and 1) or a number")
    ap.add_argument("--foreach", choices=["auto", "on", "off"], default="auto")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.set_grad_enabled(True)
    for name in args.only.split(","):
        if name not in CONFIGS:
            ap.error(f"unknown configuration {name}; have {', '.join(CONFIGS)}")
        run_config(name, args)


if __name__ == "__main__":
    main()
