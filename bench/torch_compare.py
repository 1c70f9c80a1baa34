#!/usr/bin/env python3
"""bench/torch_compare.py: braid against torch.distributed's Gloo, in the same processes.

The data-parallel loop of examples/python/torch_ddp.py, with its gradient
all-reduce done two ways by the same ranks: braid (all_reduce AVG + sync on the
flat gradient buffer) and torch.distributed with the gloo backend
(dist.all_reduce SUM, then divide by the world size, as DDP does: Gloo has no
AVG). Run it under braidrun; the ranks meet for Gloo through a TCP store on
127.0.0.1 whose port rank 0 picks and broadcasts with braid.

    braidrun -n 4 /usr/bin/python3 bench/torch_compare.py            # hidden widths 64 256 1024 2048
    braidrun -n 2 /usr/bin/python3 bench/torch_compare.py --hidden 256 --rounds 9 --json out.json

With the package not installed: PYTHONPATH=python BRAID_LIBRARY=build/libbraid.so.

Two measurements per model width:
- all-reduce: the flat gradient buffer of that model, all-reduced repeatedly.
  Each round times a block of iterations with braid and a block with Gloo
  (the order alternates between rounds), every block starting after a
  barrier; a block's time is the slowest rank's. The table gives the median
  over rounds of the time per all-reduce, and Gloo time / braid time.
- training: whole training steps (forward, backward, flatten, all-reduce,
  step) with each, same alternation; plus whether the parameters ended
  bitwise identical on every rank with each.
Numbers depend on the load of the machine: compare only within one run.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

import braid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "python"))
import torch_ddp  # noqa: E402  (the example's model, data and loop)


def parse():
    p = argparse.ArgumentParser(description="braid vs torch.distributed gloo on the torch_ddp example's all-reduce")
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 256, 1024, 2048], help="model widths")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--block", type=float, default=0.25, help="seconds per timed block (about)")
    p.add_argument("--train-steps", type=int, default=10, help="training steps per timed block")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", help="write the results here (rank 0)")
    return p.parse_args()


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    a = parse()
    torch.set_num_threads(a.threads)
    comm = braid.init()
    rank, world = comm.rank, comm.world_size
    port = torch.tensor([free_port() if rank == 0 else 0], dtype=torch.int32)
    comm.broadcast(port, root=0)
    comm.sync()
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % int(port[0]), rank=rank, world_size=world)

    def braid_avg(flat):
        comm.all_reduce(flat, braid.AVG)
        comm.sync()

    def gloo_avg(flat):
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat.div_(world)

    impls = {"braid": braid_avg, "gloo": gloo_avg}

    def slowest(t):
        x = torch.tensor([t], dtype=torch.float64)
        comm.all_reduce(x, braid.MAX)
        comm.sync()
        return float(x[0])

    def timed(fn, iters):
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return slowest(time.perf_counter() - t0) / iters

    load_start = loadavg()
    results = []
    for hidden in a.hidden:
        args = torch_ddp.parse_args(["--hidden", str(hidden), "--steps", str(a.train_steps)])
        model = torch_ddp.make_model(args)
        nparams = sum(p.numel() for p in model.parameters())
        flat = torch.randn(nparams, generator=torch.Generator().manual_seed(rank))

        # iterations per block: from braid's time of a few calls (same count for both)
        for f in impls.values():
            for _ in range(3):
                f(flat)
        probe = timed(lambda: braid_avg(flat), 5)
        iters = max(3, min(10000, int(a.block / max(probe, 1e-6))))
        ar = {k: [] for k in impls}
        step = {k: [] for k in impls}
        for rnd in range(a.rounds):
            order = ["braid", "gloo"] if rnd % 2 == 0 else ["gloo", "braid"]
            for k in order:
                ar[k].append(timed(lambda: impls[k](flat), iters))
        # whole training steps
        identical = {}
        for rnd in range(max(3, a.rounds // 2)):
            order = ["braid", "gloo"] if rnd % 2 == 0 else ["gloo", "braid"]
            for k in order:
                comm.barrier()
                t0 = time.perf_counter()
                m, _ = torch_ddp.train(args, rank, world, impls[k])
                step[k].append(slowest(time.perf_counter() - t0) / args.steps)
                raw = torch_ddp.flat_params(m).contiguous().view(torch.uint8)
                every = torch.empty(raw.numel() * world, dtype=torch.uint8)
                comm.all_gather(raw, every)
                comm.sync()
                blocks = every.view(world, -1)
                same = all(torch.equal(blocks[r], blocks[0]) for r in range(world))
                identical[k] = identical.get(k, True) and same
        row = {
            "hidden": hidden, "params": nparams, "bytes": nparams * 4, "ranks": world, "iters": iters,
            "braid_allreduce_us": statistics.median(ar["braid"]) * 1e6,
            "gloo_allreduce_us": statistics.median(ar["gloo"]) * 1e6,
            "braid_allreduce_us_min": min(ar["braid"]) * 1e6,
            "gloo_allreduce_us_min": min(ar["gloo"]) * 1e6,
            "braid_allreduce_us_all": [t * 1e6 for t in ar["braid"]],
            "gloo_allreduce_us_all": [t * 1e6 for t in ar["gloo"]],
            "braid_step_ms": statistics.median(step["braid"]) * 1e3,
            "gloo_step_ms": statistics.median(step["gloo"]) * 1e3,
            "braid_identical": identical["braid"], "gloo_identical": identical["gloo"],
        }
        results.append(row)
        if rank == 0:
            print("hidden %d: %d params, all-reduce braid %.1f us, gloo %.1f us (%.2fx); step braid %.2f ms, "
                  "gloo %.2f ms" % (hidden, nparams, row["braid_allreduce_us"], row["gloo_allreduce_us"],
                                    row["gloo_allreduce_us"] / row["braid_allreduce_us"], row["braid_step_ms"],
                                    row["gloo_step_ms"]), file=sys.stderr, flush=True)

    if rank == 0:
        print("\n%d ranks, backend %s, torch %s, %d torch thread(s) per rank, %d rounds, %d CPUs, load average "
              "%s at the start, %s at the end\n" % (world, comm.backend, torch.__version__, a.threads, a.rounds,
                                                     os.cpu_count(), load_start, loadavg()))
        print("| model (hidden) | gradient buffer | braid all-reduce | gloo all-reduce | gloo / braid "
              "| braid step | gloo step | gloo / braid | identical on every rank (braid / gloo) |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in results:
            kib = r["bytes"] / 1024
            size = "%.0f KiB" % kib if kib < 1024 else "%.1f MiB" % (kib / 1024)
            print("| %d | %d floats (%s) | %.1f µs (min %.1f) | %.1f µs (min %.1f) | %.2f× | %.2f ms | %.2f ms "
                  "| %.2f× | %s / %s |"
                  % (r["hidden"], r["params"], size, r["braid_allreduce_us"], r["braid_allreduce_us_min"],
                     r["gloo_allreduce_us"], r["gloo_allreduce_us_min"],
                     r["gloo_allreduce_us"] / r["braid_allreduce_us"], r["braid_step_ms"], r["gloo_step_ms"],
                     r["gloo_step_ms"] / r["braid_step_ms"], "yes" if r["braid_identical"] else "NO",
                     "yes" if r["gloo_identical"] else "no"))
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"ranks": world, "backend": comm.backend, "torch": torch.__version__,
                           "loadavg_start": load_start, "loadavg_end": loadavg(), "cpus": os.cpu_count(),
                           "threads": a.threads, "rounds": a.rounds, "results": results}, f, indent=1)
    dist.destroy_process_group()
    comm.barrier()
    comm.destroy()
    return 0 if all(r["braid_identical"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
