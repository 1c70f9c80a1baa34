"""Communicator.mem_alloc (braid_comm_mem_alloc / braid_comm_mem_free) and
Communicator.register (braid_mem_register / braid_mem_deregister) on the host
backends (self on one rank, shm on several): values through that memory,
when it is freed, the registration's life, and the refusals with braid's
sentences. The nccl side is in test_nccl_double.py."""
import ctypes
import gc
import weakref

import numpy as np
import pytest

import braid


def _host_only(comm):
    if comm.backend == "nccl":
        pytest.skip("host backends only; nccl: test_nccl_double.py")


def mapping_of(addr):
    """The line of /proc/self/maps that holds addr, or None."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return line.rstrip("\n")
    return None


def braid_memory_at(addr):
    """Whether addr lies in a mapping of braid_mem_alloc (a memfd named braid-mem-N)."""
    m = mapping_of(addr)
    return m is not None and "braid-mem-" in m


def test_mem_alloc_all_reduce_sums(comm):
    _host_only(comm)
    n, r = comm.world_size, comm.rank
    for shape, dt in (((3, 37), np.float64), (1 << 18, np.float32), (1001, np.int32)):  # 1 MiB: shm's zero copy
        a = comm.mem_alloc(shape, dt)
        assert isinstance(a, np.ndarray) and a.dtype == dt and a.flags.c_contiguous and a.flags.writeable
        assert a.shape == (shape if isinstance(shape, tuple) else (shape,))
        assert np.all(a == 0)  # zero-filled
        i = np.arange(a.size).reshape(a.shape)
        a[...] = (r + 1) * (i % 7 + 1)
        comm.all_reduce(a, braid.SUM)
        comm.sync()
        assert np.array_equal(a, (n * (n + 1) // 2) * (i % 7 + 1)), (shape, dt)
    # every rank's block of an all-gather, in place in comm memory
    g = comm.mem_alloc((n, 300), np.int64)
    g[r] = np.arange(300) * (r + 1)
    comm.all_gather(g[r], g)
    comm.sync()
    assert np.array_equal(g, np.outer(np.arange(1, n + 1), np.arange(300)))
    # out of rank 0's comm memory into every rank's
    b = comm.mem_alloc(1 << 20, "uint8")
    if r == 0:
        b[:] = np.arange(1 << 20) % 251
    comm.broadcast(b, root=0)
    comm.sync()
    assert np.array_equal(b, (np.arange(1 << 20) % 251).astype(np.uint8))


def test_mem_alloc_shapes_and_refusals(comm):
    _host_only(comm)
    e = comm.mem_alloc(0)
    assert e.shape == (0,) and e.size == 0
    assert comm.mem_alloc((2, 0, 3), np.float32).shape == (2, 0, 3)
    with pytest.raises(braid.InvalidArgumentError) as ei:
        comm.mem_alloc((2, -1))
    assert str(ei.value) == "braid_comm_mem_alloc: negative dimension in shape (2, -1) (rank %d)" % comm.rank
    with pytest.raises(braid.InvalidArgumentError, match=r"^braid_comm_mem_alloc: dtype='nosuch'"):
        comm.mem_alloc(4, "nosuch")
    with pytest.raises(braid.NoMemoryError) as ei:  # braid's own refusal: more than any machine has
        comm.mem_alloc(1 << 62, np.uint8)
    assert str(ei.value).startswith("braid_comm_mem_alloc: ") and not ei.value.fatal
    x = comm.mem_alloc(4, np.int32)  # still usable
    x[:] = 1
    comm.all_reduce(x)
    comm.sync()
    assert list(x) == [comm.world_size] * 4


def test_mem_alloc_freed_with_the_last_view(comm):
    _host_only(comm)
    a = comm.mem_alloc(5000, np.float64)
    addr = a.ctypes.data
    memfd = braid_memory_at(addr)  # False only where memfds are unavailable
    a[:] = 3.5
    v = a[10:20]
    del a
    gc.collect()
    assert np.all(v == 3.5)  # a view keeps the memory
    assert braid_memory_at(addr) == memfd
    del v
    gc.collect()
    assert not braid_memory_at(addr)  # braid_comm_mem_free unmapped it
    comm.barrier()


def test_register_round_trip(comm):
    _host_only(comm)
    n, r = comm.world_size, comm.rank
    x = np.full(1000, r + 1, dtype=np.float32)
    reg = comm.register(x)
    assert isinstance(reg, braid.Registration) and reg.registered
    assert (reg.addr, reg.nbytes) == (x.ctypes.data, x.nbytes) and reg.handle
    comm.all_reduce(x)  # a registered buffer works as any other
    comm.sync()
    assert np.all(x == n * (n + 1) / 2)
    reg.deregister()
    assert not reg.registered
    with pytest.raises(braid.InvalidArgumentError) as ei:
        reg.deregister()
    msg = str(ei.value)
    assert msg.startswith("braid_mem_deregister: the registration of 4000 bytes at 0x%x" % x.ctypes.data)
    assert msg.endswith("was deregistered already (rank %d)" % r)
    assert not ei.value.fatal

    # comm memory, registered in a with block; bytes of other containers too
    m = comm.mem_alloc(4096, np.int64)
    with comm.register(m) as reg2:
        assert reg2.registered and reg2.nbytes == m.nbytes and reg2.addr == m.ctypes.data
        m[:] = r
        comm.all_reduce(m, "max")
        comm.sync()
    assert not reg2.registered and np.all(m == n - 1)
    with comm.register(bytearray(b"abc")) as reg3:
        assert reg3.nbytes == 3
    with pytest.raises(braid.InvalidArgumentError, match="^braid_mem_deregister: .*deregistered already"):
        reg3.deregister()

    # the registration keeps its buffer alive until it ends
    y = np.ones(64)
    alive = weakref.ref(y)
    reg4 = comm.register(y)
    del y
    gc.collect()
    assert alive() is not None
    reg4.deregister()
    gc.collect()
    assert alive() is None
    # one garbage-collected while registered is deregistered then
    reg5 = comm.register(np.ones(8))
    del reg5
    gc.collect()
    comm.barrier()


def test_register_refusals(comm):
    _host_only(comm)
    with pytest.raises(braid.InvalidArgumentError, match=r"^braid_mem_register: buf is None \(rank %d\)$" % comm.rank):
        comm.register(None)
    with pytest.raises(braid.InvalidArgumentError, match="^braid_mem_register: buf is not contiguous"):
        comm.register(np.zeros((4, 4))[:, ::2])
    # braid's own refusal of an empty buffer
    with pytest.raises(braid.InvalidArgumentError) as ei:
        comm.register(np.zeros(0))
    assert str(ei.value).startswith("braid_mem_register: ") and str(ei.value).endswith("(rank %d)" % comm.rank)


def test_foreign_pointer_and_handle(comm):
    # The Communicator's objects never hand braid a pointer or handle that is
    # not theirs; braid's own refusals of foreign ones, through the package's
    # declarations and error mapping.
    _host_only(comm)
    lib, h, r = comm._lib, comm._h, comm.rank
    x = np.arange(16, dtype=np.int64)  # numpy's memory, not braid's
    with pytest.raises(braid.InvalidArgumentError) as ei:
        comm._check(lib.braid_comm_mem_free(h, x.ctypes.data), h, "braid_comm_mem_free")
    msg = str(ei.value)
    assert msg.startswith("braid_comm_mem_free: braid_mem_free: ptr 0x%x was not returned by braid_mem_alloc, "
                          "or was freed already" % x.ctypes.data), msg
    assert msg.endswith("(rank %d)" % r) and not ei.value.fatal
    assert np.array_equal(x, np.arange(16))  # nothing was freed
    with pytest.raises(braid.InvalidArgumentError) as ei:
        comm._check(lib.braid_mem_deregister(h, x.ctypes.data), h, "braid_mem_deregister")
    assert str(ei.value) == "braid_mem_deregister: handle 0x%x is not one braid_mem_register gave on backend %s " \
                            "(rank %d)" % (x.ctypes.data, comm.backend, r)
    # one of braid's, freed twice through the raw calls: the second is refused
    p = ctypes.c_void_p()
    comm._check(lib.braid_comm_mem_alloc(h, ctypes.byref(p), 64), h, "braid_comm_mem_alloc")
    comm._check(lib.braid_comm_mem_free(h, p.value), h, "braid_comm_mem_free")
    with pytest.raises(braid.InvalidArgumentError, match="^braid_comm_mem_free: braid_mem_free: ptr 0x%x was not "
                                                        "returned by braid_mem_alloc" % p.value):
        comm._check(lib.braid_comm_mem_free(h, p.value), h, "braid_comm_mem_free")
    comm.barrier()


def test_destroyed_communicator_refuses():
    p = braid.init(backend="self", rank=0, world_size=1)
    a = p.mem_alloc(1000, np.int16)
    addr = a.ctypes.data
    memfd = braid_memory_at(addr)
    reg = p.register(a)
    b = np.zeros(4)
    reg_b = p.register(b)
    p.destroy()
    assert not reg.registered and not reg_b.registered  # destroy ended them
    a[:] = 7  # host memory outlives the communicator
    assert np.all(a == 7)
    for call, f in (("braid_comm_mem_alloc", lambda: p.mem_alloc(4)),
                    ("braid_mem_register", lambda: p.register(b)),
                    ("braid_mem_deregister", reg.deregister)):
        with pytest.raises(braid.InvalidArgumentError) as ei:
            f()
        assert str(ei.value) == "%s: the communicator was destroyed (rank 0)" % call
    with reg_b:  # a with block over an ended registration does not raise
        pass
    assert braid_memory_at(addr) == memfd
    del reg, a
    gc.collect()
    assert not braid_memory_at(addr)  # freed with braid_mem_free once the array went


def test_failed_communicator_refuses():
    p = braid.init(backend="self", rank=0, world_size=1)
    a = p.mem_alloc(3000, np.uint8)
    addr = a.ctypes.data
    reg = p.register(a)
    p.abort()
    for call, f in (("braid_comm_mem_alloc", lambda: p.mem_alloc(4)),
                    ("braid_mem_register", lambda: p.register(np.zeros(2))),
                    ("braid_mem_deregister", reg.deregister)):
        with pytest.raises(braid.AbortedError) as ei:
            f()
        assert str(ei.value).startswith("%s: communicator failed earlier: braid_abort: " % call), str(ei.value)
        assert ei.value.fatal
    assert not reg.registered  # the failed deregister still ended it on this side
    del reg, a
    gc.collect()
    assert not braid_memory_at(addr)  # a failed communicator's host memory is still freed
    p.destroy()
