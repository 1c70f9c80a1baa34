"""Collectives and point-to-point on numpy arrays: values, every dtype numpy
has, every op, bitwise identity across ranks."""
import functools

import numpy as np
import pytest

import braid
from conftest import assert_same_on_every_rank, gather_bytes, world_at_least

N = 37  # not a multiple of anything braid chunks by

INT_TYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
FLOAT_TYPES = [np.float16, np.float32, np.float64]
COMPLEX_TYPES = [np.complex64, np.complex128]
ALL_TYPES = FLOAT_TYPES + INT_TYPES + COMPLEX_TYPES + [np.bool_]


def rank_input(dtype, r, n=N):
    """Small values, exact in every dtype: (r + 1) * (i % 5 + 1), some negative for signed types."""
    i = np.arange(n)
    v = (r + 1) * (i % 5 + 1)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return ((i + r) % 3 == 0).astype(dt)
    if dt.kind in "if" and dt.kind != "u":
        v = np.where(i % 2 == 1, -v, v)
    if dt.kind == "c":
        return (v + 1j * (r - i % 3)).astype(dt)
    return v.astype(dt)


def expected(dtype, size, op):
    ins = [rank_input(dtype, r) for r in range(size)]
    dt = np.dtype(dtype)
    with np.errstate(over="ignore"):
        if op == "sum":
            return functools.reduce(np.logical_or if dt.kind == "b" else np.add, ins).astype(dt)
        if op == "prod":
            return functools.reduce(np.logical_and if dt.kind == "b" else np.multiply, ins).astype(dt)
        if op == "min":
            return functools.reduce(np.minimum, ins)
        if op == "max":
            return functools.reduce(np.maximum, ins)
        if op == "band":
            return functools.reduce(np.bitwise_and, ins)
        if op == "bor":
            return functools.reduce(np.bitwise_or, ins)
        if op == "bxor":
            return functools.reduce(np.bitwise_xor, ins)
        if op == "avg":
            s = functools.reduce(np.add, ins)
            if dt.kind in "iu":  # wrapped sum, divided with truncation toward zero
                return np.array([int(v) // size if v >= 0 else -((-int(v)) // size) for v in s]).astype(dt)
            return (s / dt.type(size)).astype(dt)
    raise AssertionError(op)


def ops_for(dtype):
    k = np.dtype(dtype).kind
    if k == "b":
        return ["sum", "prod", "min", "max", "band", "bor", "bxor"]
    if k == "c":
        return ["sum", "prod", "avg"]
    if k == "f":
        return ["sum", "prod", "min", "max", "avg"]
    return ["sum", "prod", "min", "max", "avg", "band", "bor", "bxor"]


CASES = [(t, op) for t in ALL_TYPES for op in ops_for(t)]


@pytest.mark.parametrize("dtype,op", CASES, ids=["%s-%s" % (np.dtype(t).name, op) for t, op in CASES])
def test_all_reduce_values(comm, dtype, op):
    x = rank_input(dtype, comm.rank)
    out = comm.all_reduce(x, op)
    comm.sync()
    assert out is x
    want = expected(dtype, comm.world_size, op)
    assert x.dtype == np.dtype(dtype)
    assert x.tobytes() == want.tobytes(), "rank %d: %s %s got %s want %s" % (comm.rank, np.dtype(dtype), op, x, want)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.complex64])
def test_all_reduce_bitwise_identical(comm, dtype):
    # Inputs whose sums round: every rank must still hold the same bits.
    rng = np.random.default_rng(1234 + comm.rank)
    x = rng.standard_normal(10007).astype(np.float64)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(10007)
    x = (x * 10.0 ** rng.integers(-3, 4, size=x.shape)).astype(dtype)
    comm.all_reduce(x, braid.Op.SUM)
    comm.sync()
    assert_same_on_every_rank(comm, x)
    y = x.copy()
    comm.all_reduce(y, braid.Op.AVG)
    comm.sync()
    assert_same_on_every_rank(comm, y)


def test_all_reduce_large_and_2d(comm):
    x = np.full((512, 1024), comm.rank + 1, dtype=np.float32)  # 2 MiB, 2-D
    comm.all_reduce(x, braid.SUM)
    comm.sync()
    assert np.all(x == comm.world_size * (comm.world_size + 1) / 2)


def test_broadcast_every_root(comm):
    for root in range(comm.world_size):
        x = np.arange(N, dtype=np.int32) * (comm.rank + 1) + comm.rank
        comm.broadcast(x, root=root)
        comm.sync()
        assert np.array_equal(x, np.arange(N, dtype=np.int32) * (root + 1) + root)


def test_all_gather(comm):
    send = np.arange(N, dtype=np.float64) + 100 * comm.rank
    recv = np.zeros(N * comm.world_size)
    assert comm.all_gather(send, recv) is recv
    comm.sync()
    want = np.concatenate([np.arange(N, dtype=np.float64) + 100 * r for r in range(comm.world_size)])
    assert np.array_equal(recv, want)
    assert np.array_equal(send, np.arange(N, dtype=np.float64) + 100 * comm.rank)  # never written


def test_all_gather_in_place_2d(comm):
    # recv as (world_size, N): this rank's row is the send buffer
    recv = np.zeros((comm.world_size, N), dtype=np.int64)
    recv[comm.rank] = np.arange(N) * (comm.rank + 1)
    comm.all_gather(recv[comm.rank], recv)
    comm.sync()
    for r in range(comm.world_size):
        assert np.array_equal(recv[r], np.arange(N) * (r + 1))


def test_all_gather_read_only_send(comm):
    send = np.full(4, comm.rank, dtype=np.uint8)
    send.flags.writeable = False  # send buffers are only read
    recv = np.zeros(4 * comm.world_size, dtype=np.uint8)
    comm.all_gather(send, recv)
    comm.sync()
    assert np.array_equal(recv, np.repeat(np.arange(comm.world_size, dtype=np.uint8), 4))


def test_reduce_scatter(comm):
    n, w = 5, comm.world_size
    send = np.arange(n * w, dtype=np.float32) * (comm.rank + 1)
    recv = np.zeros(n, dtype=np.float32)
    comm.reduce_scatter(send, recv, "sum")
    comm.sync()
    tot = w * (w + 1) / 2
    assert np.array_equal(recv, np.arange(comm.rank * n, (comm.rank + 1) * n, dtype=np.float32) * tot)


def test_reduce_scatter_in_place_max(comm):
    n, w = 3, comm.world_size
    send = (np.arange(n * w, dtype=np.int16) + 1) * (1 if comm.rank % 2 else -1) * (comm.rank + 1)
    before = send.copy()
    comm.reduce_scatter(send, send[comm.rank * n:(comm.rank + 1) * n], braid.Op.MAX)
    comm.sync()
    ins = [(np.arange(n * w, dtype=np.int16) + 1) * (1 if r % 2 else -1) * (r + 1) for r in range(w)]
    want = functools.reduce(np.maximum, ins)[comm.rank * n:(comm.rank + 1) * n]
    assert np.array_equal(send[comm.rank * n:(comm.rank + 1) * n], want)
    assert before.shape == send.shape


def test_send_recv_ring(comm):
    r, w = comm.rank, comm.world_size
    out = np.full(1000, r, dtype=np.int32)
    inp = np.zeros(1000, dtype=np.int32)
    comm.recv(inp, src=(r - 1) % w, tag=7)
    comm.send(out, dest=(r + 1) % w, tag=7)
    comm.sync()
    assert np.all(inp == (r - 1) % w)


def test_send_recv_order_per_tag(comm):
    # Messages of one (source, tag) pair arrive in the order sent.
    r, w = comm.rank, comm.world_size
    sends = [np.full(3, 10 * k + r, dtype=np.int64) for k in range(4)]
    recvs = [np.zeros(3, dtype=np.int64) for _ in range(4)]
    for k in range(4):
        comm.send(sends[k], dest=(r + 1) % w, tag=99)
    for k in range(4):
        comm.recv(recvs[k], src=(r - 1) % w, tag=99)
    comm.barrier()
    for k in range(4):
        assert np.all(recvs[k] == 10 * k + (r - 1) % w)


def test_sync_and_barrier(comm):
    comm.sync()
    comm.barrier()


@world_at_least(2)
def test_split_parity(comm):
    child = comm.split(comm.rank % 2, key=comm.world_size - comm.rank)  # reversed order within the color
    try:
        members = [r for r in range(comm.world_size) if r % 2 == comm.rank % 2]
        assert child.world_size == len(members)
        assert child.rank == sorted(members, reverse=True).index(comm.rank)
        x = np.array([comm.rank], dtype=np.int64)
        child.all_reduce(x)
        child.sync()
        assert x[0] == sum(members)
    finally:
        child.destroy()


def test_split_none(comm):
    # Rank 0 joins nothing; the others form one communicator.
    child = comm.split(None if comm.rank == 0 else 1, key=0)
    if comm.rank == 0:
        assert child is None
    else:
        with child:
            assert child.world_size == comm.world_size - 1
            assert child.rank == comm.rank - 1
            x = np.ones(1)
            child.all_reduce(x)
            child.sync()
            assert x[0] == comm.world_size - 1


def test_properties(comm):
    import os
    import re

    assert comm.world_size == int(os.environ.get("BRAID_WORLD_SIZE", "1"))
    assert comm.rank == int(os.environ.get("BRAID_RANK", "0"))
    assert comm.backend == ("self" if comm.world_size == 1 else "shm")
    assert comm.has_stream_sync is False
    assert "rank %d of %d" % (comm.rank, comm.world_size) in repr(comm)
    # the library in use is the one built from this checkout's header
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "include", "braid.h")) as f:
        h = f.read()
    want = ".".join(re.search(r"#define BRAID_VERSION_%s (\d+)" % k, h).group(1) for k in ("MAJOR", "MINOR", "PATCH"))
    assert braid.library_version() == want
    if os.environ.get("BRAID_LIBRARY"):
        assert os.path.realpath(braid.library_path()) == os.path.realpath(os.environ["BRAID_LIBRARY"])


def test_gather_bytes_helper(comm):
    blocks = gather_bytes(comm, np.array([comm.rank], dtype=np.int32))
    assert [np.frombuffer(b, dtype=np.int32)[0] for b in blocks] == list(range(comm.world_size))


@pytest.mark.parametrize("dtype,op", [(np.float32, "sum"), (np.int64, "max"), (np.float16, "avg"),
                                      (np.complex128, "prod"), (np.bool_, "bor")])
def test_reduce_every_root(comm, dtype, op):
    want = expected(dtype, comm.world_size, op)
    for root in range(comm.world_size):
        send = rank_input(dtype, comm.rank)
        before = send.copy()
        recv = np.zeros_like(send) if comm.rank == root else None
        out = comm.reduce(send, recv, op, root=root)
        comm.sync()
        assert out is recv
        assert send.tobytes() == before.tobytes()  # send is only read
        if comm.rank == root:
            assert recv.tobytes() == want.tobytes(), "root %d: %s %s got %s want %s" % (root, dtype, op, recv, want)


def test_reduce_in_place_at_root(comm):
    root = comm.world_size - 1
    x = np.arange(N, dtype=np.int32) * (comm.rank + 1)
    before = x.copy()
    out = comm.reduce(x, None, braid.SUM, root=root)  # recv None: in place at the root
    comm.sync()
    w = comm.world_size
    if comm.rank == root:
        assert out is x
        assert np.array_equal(x, np.arange(N, dtype=np.int32) * (w * (w + 1) // 2))
    else:
        assert out is None
        assert np.array_equal(x, before)


def test_gather_every_root(comm):
    w = comm.world_size
    for root in range(w):
        send = np.arange(N, dtype=np.uint16) + 1000 * comm.rank + root
        recv = np.zeros(N * w, dtype=np.uint16) if comm.rank == root else None
        assert comm.gather(send, recv, root=root) is recv
        comm.sync()
        if comm.rank == root:
            want = np.concatenate([np.arange(N, dtype=np.uint16) + 1000 * r + root for r in range(w)])
            assert np.array_equal(recv, want)


def test_gather_in_place_2d(comm):
    w, root = comm.world_size, 0
    recv = np.zeros((w, N), dtype=np.float64)
    recv[comm.rank] = np.arange(N) + 0.5 * comm.rank
    comm.gather(recv[comm.rank], recv if comm.rank == root else None, root=root)
    comm.sync()
    if comm.rank == root:
        for r in range(w):
            assert np.array_equal(recv[r], np.arange(N) + 0.5 * r)


def test_scatter_every_root(comm):
    w = comm.world_size
    for root in range(w):
        send = (np.arange(N * w, dtype=np.int8) + root) if comm.rank == root else None
        recv = np.full(N, -1, dtype=np.int8)
        assert comm.scatter(send, recv, root=root) is recv
        comm.sync()
        want = (np.arange(N * w, dtype=np.int8) + root)[comm.rank * N:(comm.rank + 1) * N]
        assert np.array_equal(recv, want)


def test_scatter_in_place_at_root(comm):
    w, root = comm.world_size, comm.world_size - 1
    send = np.arange(N * w, dtype=np.float32) if comm.rank == root else None
    recv = send[root * N:(root + 1) * N] if comm.rank == root else np.zeros(N, dtype=np.float32)
    comm.scatter(send, recv, root=root)
    comm.sync()
    assert np.array_equal(recv, np.arange(comm.rank * N, (comm.rank + 1) * N, dtype=np.float32))


@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
def test_all_to_all(comm, in_place):
    w, r, n = comm.world_size, comm.rank, 5
    # block j of rank r holds 100*r + j, n times
    send = np.repeat(100 * r + np.arange(w, dtype=np.int64), n)
    recv = send if in_place else np.zeros_like(send)
    before = send.copy()
    assert comm.all_to_all(send, recv) is recv
    comm.sync()
    assert np.array_equal(recv, np.repeat(100 * np.arange(w, dtype=np.int64) + r, n))
    if not in_place:
        assert np.array_equal(send, before)
