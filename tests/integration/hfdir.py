"""Hugging Face model directories written from numpy for the import tests:
a tiny random GPT-2 (config.json and safetensors, GPT2LMHeadModel's names
with or without "transformer.", one file or shards with an index, F32, F16
or BF16).  The safetensors writer is here rather than the package's so that
it writes BF16 without extra packages and can write deliberately wrong
files."""
import json
import os
import struct

import numpy as np


def gpt2_tensors(C, L, T, V, seed):
    """GPT-2's tensors in its files' layout (Conv1D matrices (in, out)),
    random, in float32."""
    r = np.random.default_rng(seed)
    shapes = {"wte.weight": (V, C), "wpe.weight": (T, C)}
    for l in range(L):
        p = "h.%d." % l
        shapes.update({
            p + "ln_1.weight": (C,), p + "ln_1.bias": (C,),
            p + "attn.c_attn.weight": (C, 3 * C), p + "attn.c_attn.bias": (3 * C,),
            p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
            p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
            p + "mlp.c_fc.weight": (C, 4 * C), p + "mlp.c_fc.bias": (4 * C,),
            p + "mlp.c_proj.weight": (4 * C, C), p + "mlp.c_proj.bias": (C,)})
    shapes.update({"ln_f.weight": (C,), "ln_f.bias": (C,)})
    out = {}
    for k, s in shapes.items():
        scale = 0.3 if k.startswith(("wte", "wpe")) else 0.15
        out[k] = (r.standard_normal(s) * scale).astype(np.float32)
        if k.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            out[k] += 1
    return out


def bf16_bits(a):
    """float32 -> bfloat16 bit patterns (truncated: any pattern will do)."""
    return (np.ascontiguousarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> (dtype name, shape, raw bytes)."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    at = 0
    for name, (dt, shape, raw) in tensors.items():
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [at, at + len(raw)]}
        at += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-(8 + len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, _, raw in tensors.values():
            f.write(raw)


def encode(a, dtype):
    """(dtype name, shape, bytes) of a in that dtype, and the float32 values
    an exact reader gets back."""
    if dtype == "F32":
        a = np.ascontiguousarray(a, np.float32)
        return ("F32", a.shape, a.tobytes()), a
    if dtype == "F16":
        h = a.astype(np.float16)
        return ("F16", a.shape, h.tobytes()), h.astype(np.float32)
    if dtype == "BF16":
        b = bf16_bits(a)
        return ("BF16", a.shape, b.tobytes()), bf16_value(b)
    raise ValueError(dtype)


def gpt2_config(C, L, H, T, V, **extra):
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": C, "n_layer": L, "n_head": H,
           "n_positions": T, "n_ctx": T, "vocab_size": V, "activation_function": "gelu_new",
           "layer_norm_epsilon": 1e-5, "n_inner": None, "tie_word_embeddings": True}
    cfg.update(extra)
    return cfg


def write_gpt2(d, C=16, L=2, H=2, T=32, V=256, seed=0, prefix="transformer.", dtype="F32", shards=1,
               config=None, extra=None, drop=(), reshape=None, bias_buffers=False):
    """A GPT-2 directory at d.  Returns what gradd must read back: its own
    tensor names -> float32 values (in the files' layout).  extra: more
    tensors (name -> array, written as given); drop: names left out;
    reshape: name -> array written instead."""
    os.makedirs(d, exist_ok=True)
    ts = gpt2_tensors(C, L, T, V, seed)
    want, files = {}, {}
    for k, a in ts.items():
        if k in drop:
            continue
        if reshape and k in reshape:
            a = reshape[k]
        enc, back = encode(a, dtype)
        files[prefix + k] = enc
        want[k] = back
    if bias_buffers:
        for l in range(L):
            files[prefix + "h.%d.attn.bias" % l] = encode(np.tril(np.ones((1, 1, T, T), np.float32)), "F32")[0]
        files["lm_head.weight"] = files[prefix + "wte.weight"]
    for k, a in (extra or {}).items():
        files[k] = encode(a, "F32")[0] if a.dtype == np.float32 else (
            {np.float64: "F64", np.int32: "I32"}[a.dtype.type], a.shape, a.tobytes())
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), files, {"format": "pt"})
    else:
        names = list(files)
        index = {"metadata": {"total_size": sum(len(v[2]) for v in files.values())}, "weight_map": {}}
        for s in range(shards):
            part = {n: files[n] for n in names[s::shards]}
            fn = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
            write_safetensors(os.path.join(d, fn), part, {"format": "pt"})
            index["weight_map"].update({n: fn for n in part})
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config if config is not None else gpt2_config(C, L, H, T, V), f)
    return want


def llama_config(C, L, H, KVH, F, T, V, tie=False, **extra):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C,
           "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": H,
           "num_key_value_heads": KVH, "max_position_embeddings": T, "vocab_size": V, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": tie, "attention_bias": False}
    cfg.update(extra)
    return cfg


def write_llama(d, C=32, L=2, H=4, KVH=2, F=64, T=32, V=96, tie=False, seed=0, dtype="F32", **extra):
    """A LlamaForCausalLM directory at d (one model.safetensors), random;
    extra goes into config.json.  Returns gradd's tensor names
    (transformers' own) -> float32 values."""
    os.makedirs(d, exist_ok=True)
    r = np.random.default_rng(seed)
    hs = C // H
    shapes = {"model.embed_tokens.weight": (V, C)}
    for l in range(L):
        p = "model.layers.%d." % l
        shapes.update({
            p + "input_layernorm.weight": (C,), p + "self_attn.q_proj.weight": (C, C),
            p + "self_attn.k_proj.weight": (KVH * hs, C), p + "self_attn.v_proj.weight": (KVH * hs, C),
            p + "self_attn.o_proj.weight": (C, C), p + "post_attention_layernorm.weight": (C,),
            p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
            p + "mlp.down_proj.weight": (C, F)})
    shapes["model.norm.weight"] = (C,)
    if not tie:
        shapes["lm_head.weight"] = (V, C)
    want, files = {}, {}
    for k, s in shapes.items():
        a = (r.standard_normal(s) * (0.1 if k.endswith("norm.weight") else 0.2)).astype(np.float32)
        if k.endswith("norm.weight"):
            a += 1
        enc, back = encode(a, dtype)
        files[k] = enc
        want[k] = back
    write_safetensors(os.path.join(d, "model.safetensors"), files, {"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(llama_config(C, L, H, KVH, F, T, V, tie, **extra), f)
    return want
