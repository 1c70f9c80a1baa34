"""Errors: the exception class per braid_status, braid's sentence, fatal
errors, refused buffers, abort, and the GIL released during calls."""
import contextlib
import gc
import os
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest

import braid
from conftest import world_at_least


def test_root_out_of_range(comm):
    x = np.zeros(4, dtype=np.float32)
    with pytest.raises(braid.InvalidArgumentError) as ei:
        comm.broadcast(x, root=comm.world_size + 6)
    e = ei.value
    assert str(e) == "braid_broadcast: root %d out of range for world size %d (rank %d)" % (
        comm.world_size + 6, comm.world_size, comm.rank)
    assert e.status == braid.Status.INVALID_ARG and not e.fatal
    assert isinstance(e, ValueError) and isinstance(e, braid.Error)
    # not fatal: the communicator goes on
    comm.all_reduce(x)
    comm.sync()


def test_unsupported_pair(comm):
    x = np.ones(3, dtype=np.float32)
    with pytest.raises(braid.UnsupportedError) as ei:
        comm.all_reduce(x, "band")
    assert ei.value.status == braid.Status.UNSUPPORTED
    assert isinstance(ei.value, NotImplementedError)
    assert str(ei.value).startswith("braid_all_reduce: ")
    assert "(rank %d)" % comm.rank in str(ei.value)
    assert np.all(x == 1)  # a rejected call does nothing
    b = np.ones(3, dtype=bool)
    with pytest.raises(braid.UnsupportedError):
        comm.all_reduce(b, "avg")


def test_non_contiguous_refused(comm):
    x = np.zeros((4, 6), dtype=np.float64)
    with pytest.raises(braid.InvalidArgumentError) as ei:
        comm.all_reduce(x[:, ::2])
    msg = str(ei.value)
    assert msg.startswith("braid_all_reduce: buf is not contiguous (shape (4, 3), strides (48, 16))")
    assert "does not copy" in msg and msg.endswith("(rank %d)" % comm.rank)
    with pytest.raises(braid.InvalidArgumentError, match="not contiguous"):
        comm.all_reduce(x.T)  # Fortran order is not C-contiguous
    with pytest.raises(braid.InvalidArgumentError, match="braid_send: buf is not contiguous"):
        comm.send(x[::2], dest=comm.rank)


def test_read_only_refused(comm):
    x = np.zeros(4)
    x.flags.writeable = False
    with pytest.raises(braid.InvalidArgumentError) as ei:
        comm.all_reduce(x)
    assert str(ei.value) == ("braid_all_reduce: buf is read-only but the call writes into it; pass a writable "
                             "array (rank %d)" % comm.rank)
    with pytest.raises(braid.InvalidArgumentError, match="braid_recv: buf is read-only"):
        comm.recv(b"abcd", src=comm.rank)
    with pytest.raises(braid.InvalidArgumentError, match="braid_all_gather: recv is read-only"):
        comm.all_gather(np.zeros(1), x)


def test_not_an_array(comm):
    with pytest.raises(braid.InvalidArgumentError, match="neither the buffer protocol nor DLPack") as ei:
        comm.all_reduce([1.0, 2.0])
    assert isinstance(ei.value, TypeError)
    with pytest.raises(braid.InvalidArgumentError, match="buf is None"):
        comm.broadcast(None)


def test_unknown_element_type(comm):
    x = np.zeros(3, dtype="datetime64[s]")
    with pytest.raises(braid.InvalidArgumentError, match="braid_all_reduce: "):
        comm.all_reduce(x)
    be = np.zeros(3, dtype=">f4")
    with pytest.raises(braid.InvalidArgumentError, match="big-endian"):
        comm.all_reduce(be)
    with pytest.raises(ValueError, match="not a reduction braid has"):
        comm.all_reduce(np.zeros(1), "median")


def test_dtype_override(comm):
    # numpy has no bfloat16: a uint16 array holds its bits. 1.0 is 0x3f80.
    x = np.full(5, 0x3F80, dtype=np.uint16)
    comm.all_reduce(x, "sum", dtype=braid.DType.BF16)
    comm.sync()
    want = np.float32(comm.world_size).view(np.uint32) >> 16  # small integers are exact in bf16
    assert np.all(x == want)
    with pytest.raises(braid.InvalidArgumentError, match="dtype=bf16 has 2-byte elements but buf holds f32"):
        comm.all_reduce(np.zeros(2, dtype=np.float32), dtype="bf16")
    raw = bytearray(6)  # raw bytes may be read as any type whose size divides them
    comm.all_reduce(raw, dtype="f16")
    with pytest.raises(braid.InvalidArgumentError, match="not a whole number of f32 elements"):
        comm.all_reduce(raw, dtype="f32")


def test_fp8_through_bytes(comm):
    # FP8 E4M3 1.0 is 0x38, 2.0 is 0x40, 4.0 is 0x48.
    x = np.full(8, 0x38, dtype=np.uint8)
    comm.all_reduce(x, "sum", dtype="fp8_e4m3")
    comm.sync()
    want = {1: 0x38, 2: 0x40, 3: 0x44, 4: 0x48}[comm.world_size]
    assert np.all(x == want)


def test_size_checks(comm):
    w = comm.world_size
    with pytest.raises(braid.InvalidArgumentError) as ei:
        comm.all_gather(np.zeros(4, np.float32), np.zeros(4 * w + 1, np.float32))
    assert str(ei.value) == ("braid_all_gather: recv holds %d elements of f32 but must hold %d (%d ranks x 4) "
                             "(rank %d)" % (4 * w + 1, 4 * w, w, comm.rank))
    with pytest.raises(braid.InvalidArgumentError, match="send holds f32 elements but recv holds f64"):
        comm.all_gather(np.zeros(4, np.float32), np.zeros(4 * w, np.float64))
    with pytest.raises(braid.InvalidArgumentError) as ei:
        comm.reduce_scatter(np.zeros(3, np.int32), np.zeros(2, np.int32))
    assert str(ei.value) == ("braid_reduce_scatter: send holds 3 elements of i32 but must hold %d (%d ranks x 2) "
                             "(rank %d)" % (2 * w, w, comm.rank))


def test_recv_shape_mismatch(comm):
    # A receive of another size fails naming both sizes; the message stays for a receive of the right shape.
    r, w = comm.rank, comm.world_size
    comm.send(np.arange(3, dtype=np.float64), dest=(r + 1) % w, tag=5)
    comm.barrier()  # the message has arrived before the receive is posted
    small = np.zeros(2)
    with pytest.raises(braid.MismatchError) as ei:
        comm.recv(small, src=(r - 1) % w, tag=5)
        comm.sync()
    e = ei.value
    assert e.status == braid.Status.MISMATCH and not e.fatal
    assert str(e) == ("braid_recv: message from rank %d with tag 5 has 3 elements of f64 (24 bytes) but the "
                      "receive expects 2 elements of f64 (16 bytes) (rank %d)" % ((r - 1) % w, r))
    right = np.zeros(3)
    comm.recv(right, src=(r - 1) % w, tag=5)
    comm.sync()
    assert np.array_equal(right, np.arange(3.0))


@world_at_least(2)
def test_collective_mismatch_is_fatal(comm):
    child = comm.split(0, comm.rank)
    x = np.zeros(16, dtype=np.float32)
    try:
        with pytest.raises(braid.MismatchError) as ei:
            if child.rank == 0:
                child.broadcast(x, root=0)
                child.barrier()  # the root learns from its next call at the latest
            else:
                child.all_reduce(x)
                child.sync()
        e = ei.value
        assert e.fatal
        assert "braid_broadcast(root 0, 16 x f32)" in str(e) or "braid_all_reduce(16 x f32, sum)" in str(e)
        with pytest.raises(braid.Error) as again:  # failed: every later call fails at once
            child.sync()
        assert again.value.status in (braid.Status.MISMATCH, braid.Status.PEER_LOST)
    finally:
        child.destroy()
    comm.barrier()


def test_timeout_is_fatal():
    x = np.zeros(3)
    with braid.init(backend="self", rank=0, world_size=1, timeout=0.2) as c:
        c.recv(x, src=0, tag=1)  # nobody sends
        t0 = time.monotonic()
        with pytest.raises(braid.TimeoutError) as ei:
            c.sync()
        assert 0.15 < time.monotonic() - t0 < 5
        e = ei.value
        assert isinstance(e, TimeoutError) and e.fatal and e.status == braid.Status.TIMEOUT
        assert str(e).startswith("braid_sync: timed out after 0.2 s")
        with pytest.raises(braid.TimeoutError) as again:
            c.all_reduce(np.zeros(1))
        assert str(again.value).startswith("braid_all_reduce: communicator failed earlier: braid_sync: timed out")


def test_abort_from_another_thread(private):
    x = np.zeros(2)
    private.recv(x, src=0, tag=3)  # nobody sends: sync blocks until the abort
    errors = []

    def blocked():
        try:
            private.sync()
        except braid.Error as e:
            errors.append(e)

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.2)
    private.abort()
    t.join(10)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], braid.AbortedError) and errors[0].fatal
    with pytest.raises(braid.AbortedError):
        private.barrier()


@world_at_least(2)
def test_abort_reaches_the_other_ranks(comm):
    child = comm.split(0, comm.rank)
    try:
        if child.rank == 0:
            child.abort()
            with pytest.raises(braid.AbortedError):
                child.barrier()
        else:
            with pytest.raises(braid.PeerLostError) as ei:
                child.barrier()
            assert isinstance(ei.value, ConnectionError) and ei.value.fatal
            assert "rank 0 aborted the communicator" in str(ei.value)
    finally:
        child.destroy()
    comm.barrier()


def test_gil_released_one_process(private):
    # sync() waits for a send from another Python thread: it can only come if
    # sync released the GIL while it waited inside the library.
    got = np.zeros(4)
    private.recv(got, src=0, tag=11)

    def sender():
        time.sleep(0.2)
        private.send(np.arange(4.0), dest=0, tag=11)

    t = threading.Thread(target=sender)
    t.start()
    private.sync()
    t.join(10)
    assert np.array_equal(got, np.arange(4.0))


@world_at_least(2)
def test_gil_released_across_ranks(comm):
    # Rank 0 arrives late; the other ranks wait in barrier() while a Python thread keeps counting.
    count = [0]
    stop = threading.Event()

    def counter():
        while not stop.is_set():
            count[0] += 1
            time.sleep(0.001)

    # A daemon thread stopped in `finally`: a failing barrier must not leave
    # it counting and keep the interpreter from exiting.
    t = threading.Thread(target=counter, daemon=True)
    t.start()
    try:
        time.sleep(0.05)
        if comm.rank == 0:
            time.sleep(1.0)
        before = count[0]
        comm.barrier()
        during = count[0] - before
    finally:
        stop.set()
        t.join()
    if comm.rank != 0:
        # with the GIL held through the barrier the thread could not count at all
        assert during >= 20, "the counting thread advanced %d times during a 1 s barrier" % during


def test_destroyed_communicator(comm):
    c = comm.split(0, comm.rank)
    c.destroy()
    c.destroy()  # idempotent
    assert c.closed
    with pytest.raises(braid.InvalidArgumentError, match="braid_all_reduce: the communicator was destroyed"):
        c.all_reduce(np.zeros(1))


def test_init_errors(comm):
    with pytest.raises(braid.InvalidArgumentError, match='braid_init: unknown backend "nosuch"'):
        braid.init(backend="nosuch")
    with pytest.raises(braid.BootstrapError) as ei:
        braid.init(backend="shm", rank=0, world_size=2, store="127.0.0.1:1", token="ab" * 32, init_timeout=0.3,
                   local_rank=0, local_size=1)
    assert isinstance(ei.value, ConnectionError)
    assert "could not reach the store at 127.0.0.1:1" in str(ei.value)


def test_error_for_every_status():
    for st, cls in [(1, braid.InvalidArgumentError), (2, braid.UnsupportedError), (3, braid.NoMemoryError),
                    (4, braid.TimeoutError), (5, braid.PeerLostError), (6, braid.AbortedError),
                    (7, braid.MismatchError), (8, braid.BootstrapError), (9, braid.SystemCallError),
                    (10, braid.BackendError), (11, braid.InternalError)]:
        from braid._errors import error_for

        e = error_for(st, "braid_x: something (rank 0)")
        assert type(e) is cls and e.status == st and str(e) == "braid_x: something (rank 0)"
    assert issubclass(braid.TimeoutError, TimeoutError) and issubclass(braid.NoMemoryError, MemoryError)
    assert issubclass(braid.SystemCallError, OSError)


def test_library_not_found():
    env = dict(os.environ, BRAID_LIBRARY="/nonexistent/libbraid.so")
    code = "import braid\ntry:\n braid.init()\nexcept braid.LibraryNotFoundError as e:\n print('NF', e)\n"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("NF BRAID_LIBRARY=/nonexistent/libbraid.so could not be loaded")


def test_mem_alloc(comm):
    a = braid.mem_alloc((3, 5), np.float64)
    assert a.shape == (3, 5) and a.dtype == np.float64 and a.flags.c_contiguous and a.flags.writeable
    assert np.all(a == 0)  # zero-filled
    a[:] = comm.rank + 1
    comm.all_reduce(a)
    comm.sync()
    assert np.all(a == comm.world_size * (comm.world_size + 1) / 2)
    b = braid.mem_alloc(1 << 20, "uint8")  # 1 MiB, broadcast straight out of braid memory
    if comm.rank == 0:
        b[:] = np.arange(1 << 20) % 251
    comm.broadcast(b, root=0)
    comm.sync()
    assert np.array_equal(b, (np.arange(1 << 20) % 251).astype(np.uint8))
    v = b[10:20]  # a view keeps the memory alive after the array is gone
    del b
    import gc

    gc.collect()
    assert list(v) == [x % 251 for x in range(10, 20)]
    with pytest.raises(braid.InvalidArgumentError, match="negative dimension"):
        braid.mem_alloc((2, -1))


def test_names_of_types_and_ops():
    D = braid.DType
    assert [braid.as_dtype(n) for n in ("f32", "float16", "bf16", "fp8_e5m2", "uint64", "bool", "complex64")] == [
        D.F32, D.F16, D.BF16, D.FP8_E5M2, D.U64, D.BOOL, D.C64]
    assert braid.as_dtype(np.int16) is D.I16 and braid.as_dtype(np.dtype("<c16")) is D.C128
    assert [int(d) for d in (D.F64, D.BF16, D.FP8_E4M3, D.I8, D.U8, D.BOOL, D.C128)] == [0, 3, 4, 13, 23, 30, 41]
    assert [d.itemsize for d in (D.F64, D.BF16, D.FP8_E4M3, D.C64, D.C128)] == [8, 2, 1, 8, 16]
    assert [braid.as_op(n) for n in ("sum", "avg", "mean", "bxor", 3)] == [braid.SUM, braid.AVG, braid.AVG,
                                                                           braid.BXOR, braid.MAX]
    with pytest.raises(ValueError, match="not an element type braid has"):
        braid.as_dtype("float128")



def test_rooted_and_all_to_all_errors(comm):
    # Every rank makes the same mistake (each names itself the root), so every
    # rank raises before the collective and the communicator goes on.
    w, r = comm.world_size, comm.rank
    x = np.zeros(4, dtype=np.float32)
    with pytest.raises(braid.InvalidArgumentError) as ei:
        comm.reduce(x, x, root=-1)
    assert str(ei.value) == "braid_reduce: root -1 out of range for world size %d (rank %d)" % (w, r)
    assert not ei.value.fatal
    with pytest.raises(braid.InvalidArgumentError) as ei:
        comm.gather(x, np.zeros(4 * w + 2, np.float32), root=r)
    assert str(ei.value) == ("braid_gather: recv holds %d elements of f32 but must hold %d (%d ranks x 4) "
                             "(rank %d)" % (4 * w + 2, 4 * w, w, r))
    with pytest.raises(braid.InvalidArgumentError) as ei:
        comm.scatter(None, x, root=r)
    assert str(ei.value) == "braid_scatter: send is None at the root (rank %d)" % r
    with pytest.raises(braid.InvalidArgumentError) as ei:
        comm.all_to_all(np.zeros(4 * w, np.int8), np.zeros(4 * w + 1, np.int8))
    assert str(ei.value) == ("braid_all_to_all: send holds %d elements of i8 but recv holds %d; both hold "
                             "world_size blocks of one size (rank %d)" % (4 * w, 4 * w + 1, r))
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(braid.InvalidArgumentError, match="braid_reduce: send is read-only"):
        comm.reduce(ro, None, root=r)  # in place at the root: send is written
    comm.all_reduce(x)
    comm.sync()
    assert np.all(x == 0)


def test_integers_that_do_not_fit(private):
    # ctypes would wrap them: root 2**32 would act as root 0, tag -1 as tag 2**32 - 1.
    x = np.zeros(2)
    with pytest.raises(braid.InvalidArgumentError, match=r"braid_broadcast: root 4294967296 does not fit a C int"):
        private.broadcast(x, root=2**32)
    with pytest.raises(braid.InvalidArgumentError, match=r"braid_send: dest 4294967296 does not fit a C int"):
        private.send(x, dest=2**32)
    with pytest.raises(braid.InvalidArgumentError, match=r"braid_recv: tag -1 is not a 32-bit unsigned value"):
        private.recv(x, src=0, tag=-1)
    with pytest.raises(braid.InvalidArgumentError, match=r"braid_split: color 4294967301 is not a 32-bit"):
        private.split(2**32 + 5)
    with pytest.raises(braid.InvalidArgumentError, match=r"braid_split: color -1 is not a 32-bit"):
        private.split(-1)
    with pytest.raises(braid.InvalidArgumentError, match=r"braid_reduce: root -4294967296 does not fit a C int"):
        private.reduce(x, root=-2**32)
    with pytest.raises(braid.InvalidArgumentError, match=r"braid_init: world_size 4294967297 does not fit a C int"):
        braid.init(backend="self", rank=0, world_size=2**32 + 1)
    # The largest values pass through unchanged.
    private.send(x + 1, dest=0, tag=2**32 - 1)
    got = np.zeros(2)
    private.recv(got, src=0, tag=2**32 - 1)
    private.sync()
    assert np.array_equal(got, x + 1)
    assert private.split(braid.SPLIT_NONE) is None


def test_destroy_while_another_thread_waits(private):
    # Freeing the communicator under a blocked sync() would crash the
    # process: destroy() refuses, and works once the call returned.
    got = np.zeros(3)
    private.recv(got, src=0, tag=4)
    done = []
    t = threading.Thread(target=lambda: done.append(private.sync()))
    t.start()
    deadline = time.time() + 10
    while private._calls == 0 and time.time() < deadline:
        time.sleep(0.01)
    with pytest.raises(braid.InvalidArgumentError,
                       match=r"braid_destroy: 1 call\(s\) on this communicator are still running in other threads"):
        private.destroy()
    assert not private.closed
    private.send(np.arange(3.0), dest=0, tag=4)
    t.join(10)
    assert not t.is_alive() and done == [None]
    assert np.array_equal(got, np.arange(3.0))
    private.destroy()
    assert private.closed


@contextlib.contextmanager
def library_call(comm, name, around):
    """comm's calls of the C function name go through around(fn, *args),
    fn being the real one: where another thread would act, made certain."""
    real = comm._lib

    class Lib:
        def __getattr__(self, attr):
            return getattr(real, attr)

    lib = Lib()
    setattr(lib, name, lambda *args: around(getattr(real, name), *args))
    comm._lib = lib
    try:
        yield
    finally:
        comm._lib = real


def test_sync_keeps_sends_posted_after_it_began(private):
    # Another thread's send posted while sync() runs is not completed by that
    # sync: its buffer stays referenced until a later one.
    refs = []

    def send_meanwhile(sync, h):
        st = sync(h)
        if not refs:  # the other thread's send, between the C call and the release
            a = np.arange(4.0) + 10
            refs.append(weakref.ref(a))
            private.send(a, dest=0, tag=6)
        return st

    with library_call(private, "braid_sync", send_meanwhile):
        private.sync()
        gc.collect()
        assert refs and refs[0]() is not None, "the later send's buffer was released by the earlier sync"
        got = np.zeros(4)
        private.recv(got, src=0, tag=6)
        private.sync()
        assert np.array_equal(got, np.arange(4.0) + 10)
    gc.collect()
    assert refs[0]() is None, "the buffer stayed referenced after the sync that completed its send"


def test_braid_memory_outlives_atexit_handlers(tmp_path):
    # An array of braid memory used by an atexit handler registered before
    # it was allocated: the memory is not unmapped before that handler runs.
    script = tmp_path / "late_use.py"
    script.write_text(
        "import atexit, braid, numpy as np\n"
        "keep = []\n"
        "atexit.register(lambda: print('sum', float(keep[0].sum())))\n"
        "keep.append(braid.mem_alloc(1 << 20, np.float64))\n"
        "keep[0][:] = 1\n"
        "c = braid.init(backend='self', rank=0, world_size=1)\n"
        "keep.append(c.mem_alloc(1 << 16, np.float64))\n")
    env = dict(os.environ)
    for k in [k for k in env if k.startswith("BRAID_") and k not in ("BRAID_LIBRARY",)]:
        del env[k]
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, "exit status %d: %s" % (r.returncode, r.stderr[-2000:])
    assert "sum %s" % float(1 << 20) in r.stdout


def test_sync_between_hold_and_post(private):
    # Another thread's sync that runs while a send is on its way into the
    # library (before its post) does not complete it, so it must not let go
    # of its buffer either.
    refs = []

    def sync_first(send, *args):
        private.sync()  # the other thread's, just before this post
        return send(*args)

    def send_temporary():
        a = np.arange(5.0) * 3
        refs.append(weakref.ref(a))
        private.send(a, dest=0, tag=12)

    with library_call(private, "braid_send", sync_first):
        send_temporary()
    gc.collect()
    assert refs[0]() is not None, "a pending send's buffer was let go by a sync that began before its post"
    got = np.zeros(5)
    private.recv(got, src=0, tag=12)
    private.sync()
    assert np.array_equal(got, np.arange(5.0) * 3)
