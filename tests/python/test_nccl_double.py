"""The Python binding on the nccl backend, run against the host-memory
stand-in for NCCL and the CUDA runtime (tests/nccl_double), whose "device
memory" is host memory: numpy arrays serve as device buffers. Checks what
the host backends cannot: the stream/event hooks, results completed by
sync, the refusals of reductions NCCL lacks, and the Communicator's device
memory (mem_alloc) and registrations (register)."""
import ctypes
import gc
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


def host_view(m):
    """The stand-in's device memory is host memory: a numpy view of a DeviceMemory."""
    return np.frombuffer((ctypes.c_char * m.nbytes).from_address(m.ptr), dtype=m.dtype).reshape(m.shape)


def test_comm_mem_alloc_gives_device_memory(comm):
    n, r = comm.world_size, comm.rank
    m = comm.mem_alloc((4, 250), np.float32)
    assert isinstance(m, braid.DeviceMemory) and not m.freed
    assert (m.nbytes, m.shape, m.dtype) == (4000, (4, 250), np.float32) and m.ptr
    cai = m.__cuda_array_interface__
    assert (cai["shape"], cai["typestr"], cai["data"], cai["version"]) == ((4, 250), "<f4", (m.ptr, False), 3)
    v = host_view(m)
    i = np.arange(1000).reshape(4, 250)
    v[...] = (r + 1) * (i % 7 + 1)
    comm.all_reduce(m)  # collectives take it as a buffer
    comm.sync()
    assert np.array_equal(v, (n * (n + 1) // 2) * (i % 7 + 1))
    with comm.register(m) as reg:  # ncclCommRegister
        assert reg.registered and (reg.addr, reg.nbytes) == (m.ptr, 4000) and reg.handle
        with pytest.raises(braid.InvalidArgumentError) as ei:
            m.free()
        assert str(ei.value) == ("braid_comm_mem_free: device memory at 0x%x is still registered (handle 0x%x); "
                                 "deregister it first (rank %d)" % (m.ptr, reg.handle, r))
        v[...] = r
        comm.broadcast(m, root=n - 1)
        comm.sync()
        assert np.all(v == n - 1)
    assert not reg.registered
    with pytest.raises(braid.InvalidArgumentError, match="^braid_mem_deregister: .* was deregistered already"):
        reg.deregister()
    m.free()
    assert m.freed
    with pytest.raises(braid.InvalidArgumentError) as ei:
        m.free()
    assert str(ei.value) == "braid_comm_mem_free: device memory at 0x%x was freed already (rank %d)" % (m.ptr, r)
    with pytest.raises(braid.InvalidArgumentError) as ei:
        comm.all_reduce(m)
    assert str(ei.value) == "braid_all_reduce: buf (device memory at 0x%x) was freed already (rank %d)" % (m.ptr, r)
    with pytest.raises(braid.InvalidArgumentError, match="was freed already"):
        m.__cuda_array_interface__
    with comm.mem_alloc(16, np.int32) as m2:
        assert not m2.freed
    assert m2.freed
    # garbage collection frees it too
    owned = len(comm._owned)
    m3 = comm.mem_alloc(8, np.float64)
    assert len(comm._owned) == owned + 1
    del m3
    gc.collect()
    assert len(comm._owned) == owned


def test_device_memory_refused_by_a_host_backend(comm):
    p = braid.init(backend="self", rank=0, world_size=1)
    m = comm.mem_alloc(8, np.float64)
    with pytest.raises(braid.InvalidArgumentError) as ei:
        p.all_reduce(m)
    assert str(ei.value).startswith("braid_all_reduce: buf is in CUDA device memory, but backend self takes host "
                                    "memory")
    p.destroy()
    m.free()


def test_deregister_twice_and_foreign_handle(comm):
    r = comm.rank
    m = comm.mem_alloc(64, np.uint8)
    reg = comm.register(m)
    handle = reg.handle
    reg.deregister()
    with pytest.raises(braid.InvalidArgumentError) as ei:
        reg.deregister()
    assert str(ei.value) == ("braid_mem_deregister: the registration of 64 bytes at 0x%x (handle 0x%x) was "
                             "deregistered already (rank %d)" % (m.ptr, handle, r))
    # braid's own refusal of a handle NCCL no longer knows, through the raw call
    lib, h = comm._lib, comm._h
    with pytest.raises(braid.InvalidArgumentError) as ei:
        comm._check(lib.braid_mem_deregister(h, handle), h, "braid_mem_deregister")
    msg = str(ei.value)
    assert msg.startswith("braid_mem_deregister: ncclCommDeregister failed") and msg.endswith("(rank %d)" % r), msg
    assert not ei.value.fatal
    m.free()
    comm.barrier()


def test_destroy_frees_device_memory_and_registrations(comm):
    child = comm.split(0, comm.rank)
    assert child.backend == "nccl"
    m = child.mem_alloc(100, np.uint8)
    reg = child.register(m)
    child.destroy()
    assert m.freed and not reg.registered
    for call, f in (("braid_comm_mem_free", m.free), ("braid_mem_deregister", reg.deregister),
                    ("braid_comm_mem_alloc", lambda: child.mem_alloc(4))):
        with pytest.raises(braid.InvalidArgumentError) as ei:
            f()
        assert str(ei.value) == "%s: the communicator was destroyed (rank %d)" % (call, comm.rank)
    with m:  # nothing left to free
        pass
    comm.barrier()
