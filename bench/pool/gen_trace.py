#!/usr/bin/env python3
"""gen_trace.py — a deterministic allocation trace of a small GPT in training.

The trace is what a caching device allocator sees while a GPT-2-style model
(llm.c layout, fp32) trains with a fixed effective batch whose split into
micro-batches changes part-way through, as gradd's batch controller does:

  setup      parameters allocated once (tag params);
  step 1     gradients allocated lazily by the first backward (grads), AdamW
             moments lazily by the first optimizer step (optimizer) — the
             way PyTorch does it, so they land in a pool already holding
             freed activations;
  each micro-step
             the batch's tokens and targets (data); activations allocated in
             forward order and freed in reverse order during backward
             (activations, sizes proportional to the micro-batch); workspace
             bursts of a few MiB around every matmul and attention
             (workspace, freed at once); small temporaries (layernorm
             statistics, bias-gradient partials, scalars) that go to the
             small pool;
  each optimizer step
             gradient-norm buffers (workspace), then the update;
  phases     the micro-batch goes 32 -> 16 -> 8 -> 16 -> 32 (default),
             gradient accumulation keeping micro × accum = effective batch.

Output, one op per line:
  a ID SIZE TAG      allocate SIZE bytes (tag: params grads optimizer
                     activations workspace data), remembered as ID
  f ID               free ID
  # phase P micro=M accum=K
  # step S           optimizer step S (0-based, global) begins
  # ...              other comments (the header) are ignored by readers
IDs are dense, 0-based and never reused.  The same arguments always give
the same file.  --eager-state allocates grads and AdamW state with the
parameters instead (a what-if for fragmentation studies).
"""
import argparse
import random
import sys

KIB = 1 << 10
MIB = 1 << 20


class Trace:
    def __init__(self, out):
        self.out = out
        self.next_id = 0
        self.live = {}  # id -> size
        self.cur = 0
        self.peak = 0
        self.nalloc = 0
        self.nfree = 0

    def alloc(self, size, tag):
        i = self.next_id
        self.next_id += 1
        self.out.write(f"a {i} {size} {tag}\n")
        self.live[i] = size
        self.cur += size
        self.peak = max(self.peak, self.cur)
        self.nalloc += 1
        return i

    def free(self, i):
        self.out.write(f"f {i}\n")
        self.cur -= self.live.pop(i)
        self.nfree += 1

    def comment(self, text):
        self.out.write(f"# {text}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", default="-", help="trace file (default stdout)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--effective-batch", type=int, default=32)
    ap.add_argument("--phases", default="32,16,8,16,32",
                    help="micro-batch of each phase (comma-separated)")
    ap.add_argument("--steps-per-phase", type=int, default=40,
                    help="optimizer steps in each phase")
    ap.add_argument("--eager-state", action="store_true",
                    help="allocate grads and AdamW state with the parameters instead of "
                         "lazily in the first step (a what-if: no long-lived block is then "
                         "born among activations)")
    a = ap.parse_args()

    rng = random.Random(a.seed)
    out = sys.stdout if a.output == "-" else open(a.output, "w")
    t = Trace(out)
    L, C, NH, T, V = a.layers, a.d_model, a.heads, a.seq, a.vocab
    F = 4  # fp32
    micros = [int(x) for x in a.phases.split(",")]
    for m in micros:
        if m <= 0 or a.effective_batch % m:
            sys.exit(f"gen_trace: micro-batch {m} does not divide the effective batch "
                     f"{a.effective_batch}")

    t.comment(f"gradd pool trace v1: gpt layers={L} d_model={C} heads={NH} seq={T} "
              f"vocab={V} effective_batch={a.effective_batch} phases={a.phases} "
              f"steps_per_phase={a.steps_per_phase} seed={a.seed}")

    # ---- parameters (llm.c order), allocated once -----------------------------
    # Per layer: ln1 w+b, qkv w+b, attproj w+b, ln2 w+b, fc w+b, fcproj w+b.
    # Biases and layernorm parameters are packed per layer into one 64 KiB
    # tensor so every parameter tensor is 64 KiB..64 MiB.
    param_sizes = [V * C * F, T * C * F]  # wte, wpe
    for _ in range(L):
        param_sizes += [64 * KIB, 3 * C * C * F, C * C * F, 4 * C * C * F, 4 * C * C * F]
    param_sizes.append(64 * KIB)  # lnf
    params = [t.alloc(s, "params") for s in param_sizes]
    grads = [None] * len(params)
    moments = []
    if a.eager_state:
        grads = [t.alloc(s, "grads") for s in param_sizes]
        for s in param_sizes:
            moments.append(t.alloc(s, "optimizer"))
            moments.append(t.alloc(s, "optimizer"))
    lazy = not a.eager_state

    def workspace():
        # cuBLAS/cuDNN-like workspace: a few MiB, 4 KiB granular, varying.
        return rng.randrange(1 * MIB, 6 * MIB, 4 * KIB)

    def layer_param_ids(l):
        base = 2 + 5 * l
        return list(range(base, base + 5))

    def small_temp(tag="workspace"):
        # bias-gradient partials, scalars, index buffers: the small pool
        return t.alloc(rng.choice([4, 8, 256, 2 * KIB, 8 * KIB, 16 * KIB, 48 * KIB]), tag)

    def micro_step(B, first):
        BT = B * T
        act = BT * C * F
        tokens = t.alloc(BT * 4, "data")
        targets = t.alloc(BT * 4, "data")

        # ---- forward: each entry (id, size of the op's input gradient, matmul?)
        saved = []

        def fwd(size, grad_in_size, matmul=False, stats=False):
            ws = None
            if matmul:
                ws = t.alloc(workspace(), "workspace")
            i = t.alloc(size, "activations")
            extra = []
            if stats:  # layernorm mean and rstd, saved for backward
                extra = [t.alloc(BT * F, "activations"), t.alloc(BT * F, "activations")]
            if ws is not None:
                t.free(ws)
            saved.append((i, grad_in_size, matmul, extra))

        fwd(act, 0)  # encoder output (wte + wpe)
        for _ in range(L):
            fwd(act, act, stats=True)                    # ln1
            fwd(3 * act, act, matmul=True)               # qkv
            fwd(B * NH * T * T * F, 3 * act)             # preatt
            fwd(B * NH * T * T * F, B * NH * T * T * F)  # att (softmax)
            fwd(act, B * NH * T * T * F, matmul=True)    # atty = att @ v
            fwd(act, act, matmul=True)                   # attproj
            fwd(act, act)                                # residual2
            fwd(act, act, stats=True)                    # ln2
            fwd(4 * act, act, matmul=True)               # fch
            fwd(4 * act, 4 * act)                        # gelu
            fwd(act, 4 * act, matmul=True)               # fcproj
            fwd(act, act)                                # residual3
        fwd(act, act, stats=True)                        # lnf
        fwd(BT * V * F, act, matmul=True)                # logits (in-place probs)
        losses = t.alloc(BT * F, "activations")
        loss = t.alloc(4, "activations")

        # ---- backward: gradients flow through one running buffer ------------
        t.free(losses)
        dx = None
        per_layer = 12
        layer_of_entry = [None] + [l for l in range(L) for _ in range(per_layer)] + [None, None]
        done_layer = set()
        for k in range(len(saved) - 1, -1, -1):
            i, gin, matmul, extra = saved[k]
            l = layer_of_entry[k]
            if first and l is not None and l not in done_layer:
                done_layer.add(l)  # the first backward creates this layer's grads
                for p in reversed(layer_param_ids(l)):
                    grads[p] = t.alloc(param_sizes[p], "grads")
            if first and k == len(saved) - 1:
                for p in (len(params) - 1, 0):  # lnf and the tied wte, first
                    grads[p] = t.alloc(param_sizes[p], "grads")
            ws = t.alloc(workspace(), "workspace") if matmul else None
            tmp = small_temp() if matmul else None
            new_dx = t.alloc(gin, "activations") if gin else None
            if tmp is not None:
                t.free(tmp)
            if ws is not None:
                t.free(ws)
            if dx is not None:
                t.free(dx)
            dx = new_dx
            for e in reversed(extra):
                t.free(e)
            t.free(i)
        if first:
            grads[1] = t.alloc(param_sizes[1], "grads")  # wpe, last
        if dx is not None:
            t.free(dx)
        t.free(loss)
        t.free(targets)
        t.free(tokens)

    def optimizer_step(first):
        # clip_grad_norm: per-tensor norms, then the total
        norms = t.alloc(len(params) * F, "workspace")
        total = t.alloc(F, "workspace")
        t.free(norms)
        t.free(total)
        if first:  # AdamW's m and v, created by the first update
            for p in range(len(params)):
                moments.append(t.alloc(param_sizes[p], "optimizer"))
                moments.append(t.alloc(param_sizes[p], "optimizer"))
        scal = t.alloc(256, "workspace")  # lr, bias corrections
        t.free(scal)

    step = 0
    for ph, m in enumerate(micros):
        accum = a.effective_batch // m
        t.comment(f"phase {ph} micro={m} accum={accum}")
        for _ in range(a.steps_per_phase):
            t.comment(f"step {step}")
            for k in range(accum):
                micro_step(m, first=(lazy and step == 0 and k == 0))
            optimizer_step(first=(lazy and step == 0))
            step += 1

    t.comment(f"end allocs={t.nalloc} frees={t.nfree} live={len(t.live)} "
              f"live_bytes={t.cur} peak_live_bytes={t.peak}")
    if out is not sys.stdout:
        out.close()
    print(f"gen_trace: {t.nalloc + t.nfree} ops ({t.nalloc} allocs, {t.nfree} frees), "
          f"{step} steps, peak live {t.peak / (1 << 30):.2f} GiB, "
          f"{len(t.live)} blocks live at the end", file=sys.stderr)


if __name__ == "__main__":
    main()
