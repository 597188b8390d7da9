#!/usr/bin/python3
"""bench/dist/peer_ddp.py - PyTorch CPU peer of bench/dist/run.sh: the GPT of
bench/train/peer_torch.py trained data-parallel by DistributedDataParallel
over the gloo backend, N processes on this machine.

    /usr/bin/python3 bench/dist/peer_ddp.py --ranks 2 --threads 1 --batch 8

Each rank trains batch/ranks samples of every step (as gradd's ranks do),
DDP all-reduces the gradients in its buckets during the backward, then the
step clips to norm 1.0 and runs AdamW, as bench/train's peer.  Rank 0
prints one JSON object: the median ms per step over --steps steps after
--warmup, and the loss.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
import peer_torch  # noqa: E402  (the model, optimizer and batches of bench/train)


def rank_main(rank, args, store):
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=args.ranks)
    shape = dict(L=args.layers, C=args.width, H=args.heads, T=args.context, V=256)
    torch.manual_seed(1337)
    model = peer_torch.GPT(attn="explicit", **shape)
    # The causal mask (bool) and the positions are constants every rank
    # builds alike; gloo cannot broadcast a bool tensor.
    DDP = torch.nn.parallel.DistributedDataParallel
    DDP._set_params_and_buffers_to_ignore_for_model(model, [n for n, _ in model.named_buffers()])
    ddp = DDP(model, broadcast_buffers=False) if args.ranks > 1 else model
    opt = peer_torch.make_optimizer(model, foreach=False)
    gen = torch.Generator().manual_seed(1337 + rank)
    nxt = peer_torch.make_batches("gpt", shape, args.batch // args.ranks, gen)
    times, loss = peer_torch.time_steps(ddp, opt, nxt, args.warmup + args.steps)
    if rank == 0:
        print(json.dumps({"impl": "pytorch-%s-ddp-gloo" % torch.__version__, "ranks": args.ranks,
                          "threads": args.threads, "step_ms": statistics.median(times[args.warmup:]),
                          "loss": loss}), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        store = os.path.join(d, "store")
        if args.ranks == 1:
            rank_main(0, args, store)
        else:
            mp.spawn(rank_main, args=(args, store), nprocs=args.ranks)


if __name__ == "__main__":
    main()
