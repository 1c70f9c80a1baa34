"""Ratios of braid-perf on backend nccl to bench/nccl_coll (NCCL called
directly) from the JSON files tests/gpu/run.sh writes:
DIR/{braid,braidcheck,direct}.OP.ROUND.json. Per op, size and placement:
the median time of each over the rounds, and its ratio to direct's (1.00 = the
same; above 1 slower). directnb: NCCL direct on a non-blocking communicator,
as braid runs it; braidcheck: with the call check on; base: another
checkout's braid-perf (GPU_BASE_SRC). Any wrong element is reported."""
import collections
import glob
import json
import os
import statistics
import sys

d = sys.argv[1]
times = collections.defaultdict(list)  # (kind, op, inplace, size) -> [us]
wrong = 0
for path in sorted(glob.glob(os.path.join(d, "*.json"))):
    kind = os.path.basename(path).split(".")[0]
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            wrong += row.get("wrong", 0)
            times[(kind, row["op"], row["inplace"], row["size"])].append(row["time_us"])

med = {k: statistics.median(v) for k, v in times.items()}
kinds = [k for k in ("braid", "directnb", "braidcheck", "base") if any(key[0] == k for key in med)]
ops = sorted({k[1] for k in med})
for op in ops:
    print("\n%s (median of rounds; ratio = time / direct's)" % op)
    print("%12s %6s %12s" % ("bytes", "place", "direct_us") + "".join(" %14s %7s" % (k + "_us", "ratio") for k in kinds))
    keys = sorted({(k[2], k[3]) for k in med if k[1] == op}, key=lambda x: (x[1], x[0]))
    for inplace, size in keys:
        dt = med.get(("direct", op, inplace, size))
        line = "%12d %6s %12s" % (size, "in" if inplace else "out", "%.2f" % dt if dt is not None else "-")
        for k in kinds:
            t = med.get((k, op, inplace, size))
            line += " %14s %7s" % ("%.2f" % t if t is not None else "-", "%.3f" % (t / dt) if t is not None and dt else "-")
        print(line)
print("\nwrong elements in all runs: %d" % wrong)
sys.exit(1 if wrong else 0)
