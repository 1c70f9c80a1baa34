"""The Python binding on the nccl backend, run against the host-memory
stand-in for NCCL and the CUDA runtime (tests/nccl_double), whose "device
memory" is host memory: numpy arrays serve as device buffers. Checks what
the host backends cannot: the stream/event hooks, results completed by
sync, and the refusals of reductions NCCL lacks."""
import os

import numpy as np
import pytest

import braid

pytestmark = pytest.mark.skipif(
    os.environ.get("BT_NCCL_DOUBLE") != "1", reason="runs on backend nccl with the NCCL stand-in (ctest sets it up)")


def test_backend(comm):
    assert comm.backend == "nccl"
    assert comm.has_stream_sync is True


def test_overlap_hooks(comm):
    n = comm.world_size
    ready = comm.event_create()
    done = comm.event_create()
    x = np.full(1000, comm.rank + 1, dtype=np.float32)
    comm.event_record_on_stream(ready, 0)
    comm.comm_stream_wait_event(ready)
    comm.all_reduce(x)
    comm.event_record_on_comm_stream(done)
    comm.stream_wait_event(0, done)
    comm.sync_comm_stream()
    assert np.all(x == n * (n + 1) / 2)
    comm.event_destroy(ready)
    comm.event_destroy(done)


def test_collectives_complete_at_sync(comm):
    n = comm.world_size
    x = np.arange(10, dtype=np.int64) + comm.rank
    comm.all_reduce(x, op=braid.Op.MAX)
    comm.sync()
    assert np.array_equal(x, np.arange(10) + n - 1)
    out = np.zeros(3 * n, dtype=np.float64)
    comm.all_gather(np.full(3, float(comm.rank)), out)
    comm.sync()
    assert np.array_equal(out, np.repeat(np.arange(n, dtype=np.float64), 3))


def test_refusals(comm):
    x = np.zeros(4, dtype=np.int16)
    with pytest.raises(braid.UnsupportedError, match="i16"):
        comm.all_reduce(x)
    with pytest.raises(braid.UnsupportedError, match="bxor"):
        comm.all_reduce(np.zeros(4, dtype=np.int32), op=braid.Op.BXOR)
    y = np.ones(2, dtype=np.float32)
    comm.all_reduce(y)  # still usable
    comm.sync()
    assert np.all(y == comm.world_size)
