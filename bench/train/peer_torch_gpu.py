#!/usr/bin/env python3
"""bench/train/peer_torch_gpu.py - PyTorch GPU peer of gradd's GPT training step.

Run it with the GPU machine's python3 (PyTorch 2.x with CUDA), outside the
environment of gradd's bundled Debian libraries:
    python3 bench/train/peer_torch_gpu.py --modes eager,compile --batch 16

The model is the one gradd trains (daemon/models/model_gpt.c), written in plain
PyTorch: GPT-2 with learned position embeddings, pre-norm blocks (ln_1,
causal self-attention c_attn/c_proj, ln_2, MLP c_fc/GELU(tanh)/c_proj),
ln_f, output tied to wte, biases on every Linear, layernorm eps 1e-5, no
dropout, mean cross-entropy over all tokens.

Precision is what gradd's `precision = bf16` means: fp32 master weights and
optimizer state, bf16 matrix products with fp32 accumulation
(torch.autocast(dtype=bfloat16)).  One step is zero_grad, forward,
backward, clip_grad_norm_(1.0), AdamW(lr 6e-4, betas (0.9, 0.95), eps 1e-8,
weight decay 0.1 on 2+-dimensional tensors; fused=True, PyTorch's fastest),
timed between torch.cuda.synchronize() calls.

Modes (comma separated): eager and compile (torch.compile, default
options), each with attention as F.scaled_dot_product_attention (PyTorch
picks its flash kernel); "eager-explicit" computes attention as q@kᵀ, mask,
softmax, @v, which is what gradd's own kernels compute.

Output: one JSON object per mode on stdout,
  {"impl":"pytorch-2.11.0-eager","step_ms":…,"tokens_per_s":…,"mfu":…,…}
where the figures are the median over --steps timed steps after --warmup,
and MFU = tokens/s × (6·N + 12·L·C·T) / peak (N: every parameter; the
second term is attention's matrix products, forward and backward).
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H, explicit):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        self.H = H
        self.explicit = explicit

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.H, C // self.H).transpose(1, 2)
        k = k.view(B, T, self.H, C // self.H).transpose(1, 2)
        v = v.view(B, T, self.H, C // self.H).transpose(1, 2)
        if self.explicit:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, H, T, V, explicit):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, H, explicit) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def run_mode(mode, a, peak):
    torch.manual_seed(a.seed)
    explicit = mode.endswith("-explicit")
    model = GPT(a.layers, a.width, a.heads, a.context, a.vocab, explicit).cuda()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if mode.startswith("compile") else model
    B, T = a.batch, a.context
    g = torch.Generator(device="cuda").manual_seed(a.seed)
    data = torch.randint(0, 50257, (a.warmup + a.steps + 1, B, T + 1), device="cuda", generator=g)

    def step(i):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = fwd(data[i, :, :-1], data[i, :, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    t_compile = time.perf_counter()
    times = []
    for i in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step(i)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if i == 0:
            first = time.perf_counter() - t_compile
        if i >= a.warmup:
            times.append(dt)
    ms = statistics.median(times) * 1e3
    tps = B * T / (ms / 1e3)
    flops_per_token = 6 * n_params + 12 * a.layers * a.width * a.context
    out = {"impl": f"pytorch-{torch.__version__}-{mode}", "step_ms": round(ms, 3), "tokens_per_s": round(tps, 1),
           "mfu": round(tps * flops_per_token / peak, 4), "params": n_params, "batch": B, "context": T,
           "first_step_s": round(first, 2), "loss": round(float(loss), 4), "warmup": a.warmup, "steps": a.steps,
           "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
           "device": torch.cuda.get_device_name()}
    del model, opt, fwd, data
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="eager,compile,eager-explicit")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--peak-tflops", type=float, default=989.4,
                    help="dense bf16 peak of the GPU (H100/H200 SXM: 989.4)")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    for mode in a.modes.split(","):
        try:
            print(json.dumps(run_mode(mode, a, a.peak_tflops * 1e12)), flush=True)
        except Exception as e:  # one mode failing (e.g. compile) must not hide the others
            print(f"peer_torch_gpu: {mode}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
