#!/usr/bin/env python3
"""bench/llama/peer_torch_gpu.py - PyTorch peer of gradd's Llama training step.

Run it with the GPU machine's python3 (PyTorch 2.x with CUDA), outside the
environment of gradd's bundled Debian libraries:
    python3 bench/llama/peer_torch_gpu.py --modes eager,compile --batch 4

The model is the architecture gradd trains for `[model] type = llama`
(transformers' LlamaForCausalLM), written in plain PyTorch: token embedding,
pre-norm blocks (RMSNorm; attention with q/k/v/o projections without bias,
grouped-query with --kv-heads key/value heads, rotary embeddings in the
rotate_half convention with base --rope-theta; RMSNorm; SwiGLU MLP
gate/up/down without bias), a final RMSNorm, and the output layer tied to
the embedding (Llama 3.2 1B ties them) unless --untied.  Random init
(normal, std 0.02), mean cross-entropy over all tokens.  The default shape
is Llama 3.2 1B's: 16 layers, width 2048, 32 heads, 8 KV heads, MLP 8192,
vocabulary 128256, context 2048.

Precision as gradd's `precision = bf16`: fp32 master weights and optimizer
state, bf16 matrix products with fp32 accumulation (torch.autocast).  One
step is zero_grad, forward, backward, clip_grad_norm_(1.0), AdamW(lr 3e-4,
betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on 2+-dimensional tensors;
fused on CUDA), timed between synchronisations.

Modes: eager and compile (torch.compile), attention as
F.scaled_dot_product_attention where this PyTorch has it, else (and in
"eager-explicit") as q·kᵀ, causal mask, softmax, ·v.  --device cpu with a
tiny shape checks the script itself where there is no GPU.

Output: one JSON object per mode on stdout,
  {"impl":"pytorch-2.x-eager","step_ms":…,"tokens_per_s":…,"mfu":…,…}
the figures the median over --steps timed steps after --warmup, MFU =
tokens/s × (6·N + 12·L·C·T) / peak (N: every parameter).
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


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight).to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        C, H, KVH = a.width, a.heads, a.kv_heads
        self.H, self.KVH, self.HS = H, KVH, C // H
        self.input_layernorm = RMSNorm(C, a.norm_eps)
        self.q_proj = nn.Linear(C, H * self.HS, bias=False)
        self.k_proj = nn.Linear(C, KVH * self.HS, bias=False)
        self.v_proj = nn.Linear(C, KVH * self.HS, bias=False)
        self.o_proj = nn.Linear(H * self.HS, C, bias=False)
        self.post_attention_layernorm = RMSNorm(C, a.norm_eps)
        self.gate_proj = nn.Linear(C, a.mlp, bias=False)
        self.up_proj = nn.Linear(C, a.mlp, bias=False)
        self.down_proj = nn.Linear(a.mlp, C, bias=False)
        self.explicit = a.explicit or not hasattr(F, "scaled_dot_product_attention")

    def attn(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.HS).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.KVH, self.HS).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.KVH, self.HS).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.H // self.KVH
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if self.explicit:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.HS))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.H * self.HS))

    def forward(self, x, cos, sin):
        x = x + self.attn(self.input_layernorm(x), cos, sin)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed_tokens = nn.Embedding(a.vocab, a.width)
        self.layers = nn.ModuleList([Block(a) for _ in range(a.layers)])
        self.norm = RMSNorm(a.width, a.norm_eps)
        self.lm_head = None if not a.untied else nn.Linear(a.width, a.vocab, bias=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
        HS = a.width // a.heads
        inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, HS, 2, dtype=torch.float32) / HS))
        ang = torch.outer(torch.arange(a.context, dtype=torch.float32), inv_freq)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.embed_tokens(idx)
        cos, sin = self.cos[:T], self.sin[:T]
        for layer in self.layers:
            x = layer(x, cos, sin)
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(self.norm(x), w)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def run_mode(mode, a, peak):
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    a.explicit = mode.endswith("-explicit")
    model = Llama(a).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    extra = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, **extra)
    fwd = torch.compile(model) if mode.startswith("compile") else model
    B, T = a.batch, a.context
    g = torch.Generator(device=dev).manual_seed(a.seed)
    data = torch.randint(0, a.vocab, (a.warmup + a.steps + 1, B, T + 1), device=dev, generator=g)

    def step(i):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            loss = fwd(data[i, :, :-1], data[i, :, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    t_start = time.perf_counter()
    times = []
    for i in range(a.warmup + a.steps):
        sync(dev)
        t0 = time.perf_counter()
        loss = step(i)
        sync(dev)
        dt = time.perf_counter() - t0
        if i == 0:
            first = time.perf_counter() - t_start
        if i >= a.warmup:
            times.append(dt)
    ms = statistics.median(times) * 1e3
    tps = B * T / (ms / 1e3)
    flops_per_token = 6 * n_params + 12 * a.layers * a.width * a.context
    out = {"impl": f"pytorch-{torch.__version__}-{mode}", "step_ms": round(ms, 3), "tokens_per_s": round(tps, 1),
           "mfu": round(tps * flops_per_token / peak, 4), "params": n_params, "batch": B, "context": T,
           "first_step_s": round(first, 2), "loss": round(float(loss), 4), "warmup": a.warmup, "steps": a.steps}
    if dev.type == "cuda":
        out["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        out["device"] = torch.cuda.get_device_name()
        del model, opt, fwd, data
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--mlp", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--rope-theta", type=float, default=500000.0)
    ap.add_argument("--norm-eps", type=float, default=1e-5)
    ap.add_argument("--untied", action="store_true", help="an output layer of its own (Llama 3 8B); default tied")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--peak-tflops", type=float, default=989.4,
                    help="dense bf16 peak of the GPU (H100/H200 SXM: 989.4)")
    a = ap.parse_args()
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    failed = 0
    for mode in a.modes.split(","):
        try:
            print(json.dumps(run_mode(mode, a, a.peak_tflops * 1e12)), flush=True)
        except Exception as e:  # one mode failing (e.g. compile) must not hide the others
            failed += 1
            print(f"peer_torch_gpu: {mode}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    return 1 if failed == len(a.modes.split(",")) else 0


if __name__ == "__main__":
    sys.exit(main())
