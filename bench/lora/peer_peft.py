#!/usr/bin/env python3
"""bench/lora/peer_peft.py - transformers + peft peer of gradd's LoRA step.

What a person fine-tuning with LoRA in PyTorch runs: LlamaForCausalLM with
the base in bf16 (torch_dtype=torch.bfloat16, the usual way to load a base
for LoRA), peft's get_peft_model with LoraConfig(r, lora_alpha, the target
modules, no dropout), AdamW (lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight
decay 0.1, fused on CUDA) over the adapters, the adapters in fp32 as peft
makes them, autocast to bf16, clip_grad_norm_(1.0); with --recompute,
transformers' gradient checkpointing.  Random init, random tokens.  The
default shape is Llama 3.2 3B's: 28 layers, width 3072, 24 heads, 8 KV
heads, MLP 8192, vocabulary 128256, tied embeddings, context 2048.

    python3 bench/lora/peer_peft.py --batch 4 --micro 1 --mem-limit-gib 24

Output: one JSON object on stdout,
  {"impl":"peft-0.x-transformers-4.y","step_ms":…,"tokens_per_s":…,
   "peak_mem_gib":…,"trainable":…,…}
step_ms the median of --steps timed steps after --warmup.  --device cpu
with a tiny shape checks the script itself where there is no GPU.
"""
import argparse
import json
import os
import statistics
import time

import peft
import torch
import transformers


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--width", type=int, default=3072)
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--mlp", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--rope-theta", type=float, default=500000.0)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16)
    ap.add_argument("--targets", default="q_proj,v_proj")
    ap.add_argument("--recompute", action="store_true")
    ap.add_argument("--batch", type=int, default=4, help="samples per optimizer step")
    ap.add_argument("--micro", type=int, default=0, help="samples per forward/backward (default: --batch)")
    ap.add_argument("--mem-limit-gib", type=float, default=0,
                    help="cap the process's CUDA memory, as gradd's [memory] limit caps the job (0: none)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    if dev.type == "cpu":  # gradd's cpu device uses every core; Debian's torch starts with one
        torch.set_num_threads(os.cpu_count())
    if dev.type == "cuda" and a.mem_limit_gib:
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, a.mem_limit_gib * 2**30 / total), dev)
    micro = a.micro or a.batch
    cfg = transformers.LlamaConfig(
        vocab_size=a.vocab, hidden_size=a.width, intermediate_size=a.mlp, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, max_position_embeddings=a.context,
        rope_theta=a.rope_theta, rms_norm_eps=1e-5, tie_word_embeddings=True, initializer_range=0.02)
    model = transformers.LlamaForCausalLM(cfg).to(dtype=torch.bfloat16, device=dev)
    if a.recompute:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    lcfg = peft.LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=0.0, target_modules=a.targets.split(","),
                           bias="none", task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, lcfg)
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    trainable = [p for p in model.parameters() if p.requires_grad]
    extra = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW(trainable, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **extra)
    B, T = a.batch, a.context
    g = torch.Generator(device=dev).manual_seed(a.seed)
    data = torch.randint(0, a.vocab, (a.warmup + a.steps, B, T), device=dev, generator=g)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    times = []
    for i in range(a.warmup + a.steps):
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for m0 in range(0, B, micro):
            x = data[i, m0:m0 + micro]
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
                loss = model(input_ids=x, labels=x).loss
            (loss * (x.shape[0] / B)).backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        sync()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    ms = statistics.median(times) * 1e3
    out = {"impl": f"peft-{peft.__version__}-transformers-{transformers.__version__}", "step_ms": round(ms, 3),
           "tokens_per_s": round(B * T / (ms / 1e3), 1), "trainable": sum(p.numel() for p in trainable),
           "batch": B, "context": T, "micro": micro, "loss": round(loss.item(), 4), "recompute": a.recompute}
    if dev.type == "cuda":
        out["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        out["device"] = torch.cuda.get_device_name()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
