"""Fixtures for the braid Python tests.

Every rank of a braidrun job runs the same pytest session, so every test
makes the same braid calls in the same order on every rank; a test that
skips does so on every rank alike (by world size or a missing package).

ctest runs these with PYTHONPATH=python/ and BRAID_LIBRARY=the built
libbraid.so (python/bindings.cmake); by hand:

    PYTHONPATH=python BRAID_LIBRARY=build/libbraid.so \
        build/tools/braidrun/braidrun -n 4 --tag-output /usr/bin/python3 -m pytest tests/python
"""
import os

import pytest

import braid


@pytest.fixture(scope="session")
def comm():
    c = braid.init()
    yield c
    c.barrier()
    c.destroy()


@pytest.fixture
def private():
    """A one-rank communicator of this process alone (backend self), with a
    short timeout: for timeouts, aborts and threads, whatever the job's size."""
    c = braid.init(backend="self", rank=0, world_size=1, timeout=5.0)
    yield c
    c.destroy()


def world_at_least(n):
    size = int(os.environ.get("BRAID_WORLD_SIZE", "1"))
    return pytest.mark.skipif(size < n, reason="needs %d ranks, the job has %d" % (n, size))


def gather_bytes(comm, arr):
    """Every rank's bytes of a numpy array, as a list of bytes objects indexed by rank."""
    import numpy as np

    mine = np.frombuffer(arr.tobytes(), dtype=np.uint8).copy()
    out = np.zeros(mine.size * comm.world_size, dtype=np.uint8)
    comm.all_gather(mine, out)
    comm.sync()
    return [out[r * mine.size:(r + 1) * mine.size].tobytes() for r in range(comm.world_size)]


def assert_same_on_every_rank(comm, arr):
    blocks = gather_bytes(comm, arr)
    for r, b in enumerate(blocks):
        assert b == blocks[0], "rank %d's bytes differ from rank 0's" % r
