#!/usr/bin/env python3
"""Data-parallel training with PyTorch and braid.

Every rank trains the same model on its own shard of the data. After each
backward pass the gradients are flattened into one buffer, all-reduced with
AVG (braid's average, bitwise identical on every rank), copied back, and every
rank takes the same optimizer step. At the end the script checks that the
parameters are bitwise identical on every rank, and that they match a
single-process run over all shards' batches.

    braidrun -n 4 /usr/bin/python3 examples/python/torch_ddp.py [--steps 50] [--hidden 256]

With the package not installed: PYTHONPATH=python BRAID_LIBRARY=build/libbraid.so.
Needs PyTorch (Debian: python3-torch); without it, it prints SKIPPED and exits
with status 77. Exits 1 if a check fails.
"""
import argparse
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - depends on the machine
    print("SKIPPED: PyTorch is not installed (Debian: apt-get install python3-torch): %s" % e)
    sys.exit(77)

import braid


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (ranks share the cores)")
    return p.parse_args(argv)


def make_model(args):
    torch.manual_seed(1234)  # every rank starts from the same weights (rank 0's are broadcast anyway)
    return torch.nn.Sequential(
        torch.nn.Linear(args.features, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, args.classes))


def batch(args, rank, step):
    """Rank `rank`'s samples of step `step`: a fixed random linear labelling of Gaussian inputs."""
    g = torch.Generator().manual_seed(7)
    w = torch.randn(args.features, args.classes, generator=g)
    g.manual_seed(100003 * (rank + 1) + step)
    x = torch.randn(args.batch, args.features, generator=g)
    return x, (x @ w).argmax(dim=1)


class FlatGrads:
    """One contiguous buffer holding every parameter's gradient."""

    def __init__(self, params):
        self.params = [p for p in params if p.requires_grad]
        self.flat = torch.zeros(sum(p.numel() for p in self.params), dtype=self.params[0].dtype)

    def pack(self):
        o = 0
        for p in self.params:
            n = p.numel()
            self.flat[o:o + n].copy_(p.grad.reshape(-1))
            o += n
        return self.flat

    def unpack(self):
        o = 0
        for p in self.params:
            n = p.numel()
            p.grad.copy_(self.flat[o:o + n].view_as(p.grad))
            o += n


def train(args, rank, world, all_reduce_avg, steps=None):
    """Trains the model; all_reduce_avg(flat_tensor) averages the gradients
    across ranks in place. Returns (model, losses of this rank)."""
    model = make_model(args)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    grads = None
    losses = []
    for step in range(args.steps if steps is None else steps):
        x, y = batch(args, rank, step)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if grads is None:
            grads = FlatGrads(model.parameters())
        all_reduce_avg(grads.pack())
        grads.unpack()
        opt.step()
        losses.append(loss.item())
    return model, losses


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def single_process_reference(args, world):
    """The same training in one process: each step's batch is every rank's
    batch, and the mean loss over it has the average of the ranks' gradients."""
    model = make_model(args)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        xs, ys = zip(*(batch(args, r, step) for r in range(world)))
        opt.zero_grad()
        F.cross_entropy(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return flat_params(model)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    with braid.init() as comm:
        rank, world = comm.rank, comm.world_size

        def all_reduce_avg(flat):
            comm.all_reduce(flat, braid.AVG)
            comm.sync()

        model, losses = train(args, rank, world, all_reduce_avg)

        # 1. parameters bitwise identical on every rank
        mine = flat_params(model).contiguous()
        raw = mine.view(torch.uint8)
        every = torch.empty(raw.numel() * world, dtype=torch.uint8)
        comm.all_gather(raw, every)
        comm.sync()
        blocks = every.view(world, -1)
        identical = bool(all(torch.equal(blocks[r], blocks[0]) for r in range(world)))

        # 2. the same as one process training on all the data (up to summation order)
        ref = single_process_reference(args, world) if rank == 0 else torch.zeros_like(mine)
        comm.broadcast(ref, root=0)
        comm.sync()
        diff = float((mine - ref).abs().max())
        close = diff < 1e-4

        first = torch.tensor([losses[0], losses[-1]])
        comm.all_reduce(first, braid.AVG)
        comm.sync()
        learned = float(first[1]) < float(first[0])
        if rank == 0:
            print("torch_ddp: %d ranks (backend %s), %d parameters, %d steps: loss %.4f -> %.4f; parameters "
                  "bitwise identical on every rank: %s; max |difference| from single-process training: %.2e"
                  % (world, comm.backend, mine.numel(), args.steps, float(first[0]), float(first[1]),
                     "yes" if identical else "NO", diff))
        ok = identical and close and learned
        if not ok:
            print("rank %d: FAILED (identical %s, close %s, loss decreased %s)" % (rank, identical, close, learned))
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
