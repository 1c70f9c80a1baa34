#!/usr/bin/env python3
"""All-reduce a numpy vector on every rank and check the result.

    braidrun -n 4 /usr/bin/python3 examples/python/allreduce_numpy.py
    /usr/bin/python3 examples/python/allreduce_numpy.py          # one rank

With the package not installed: PYTHONPATH=python BRAID_LIBRARY=build/libbraid.so.
Exits 1 if any element is wrong on any rank.
"""
import sys

import numpy as np

import braid


def main():
    with braid.init() as comm:  # rank, size and backend come from the launcher
        rank, size = comm.rank, comm.world_size
        n = 1000
        x = np.arange(n, dtype=np.float32) + rank
        comm.all_reduce(x, braid.SUM)
        comm.sync()  # portable code syncs before reading results

        # sum over ranks of (i + r) = size*i + size*(size-1)/2
        want = size * np.arange(n, dtype=np.float32) + size * (size - 1) / 2
        wrong = int(np.count_nonzero(x != want))

        # a buffer in braid memory: shm peers read it in place
        m = braid.mem_alloc(n, np.float64)
        m[:] = rank + 1
        comm.all_reduce(m, "avg")
        comm.sync()
        wrong += int(np.count_nonzero(m != (size + 1) / 2))

        # everyone learns everyone's count of wrong elements
        counts = np.zeros(size, dtype=np.int64)
        comm.all_gather(np.array([wrong], dtype=np.int64), counts)
        comm.sync()
        print("rank %d of %d (backend %s): all-reduce of %d floats, %d wrong" % (rank, size, comm.backend, n, wrong))
        return 0 if counts.sum() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
