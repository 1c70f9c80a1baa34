"""PyTorch CUDA tensors on the nccl backend: every collective and send/recv
on device memory, the dtypes NCCL has, AVG, refusals, and the ordering of
braid's communication stream after the stream that wrote a tensor.

Needs a GPU (one per rank) and a job on backend nccl:

    PYTHONPATH=python BRAID_LIBRARY=build/libbraid.so \\
        build/tools/braidrun/braidrun -n 1 --backend nccl python3 -m pytest tests/python/test_cuda.py
"""
import pytest

import braid

torch = pytest.importorskip("torch", reason="PyTorch (Debian: python3-torch) is not installed")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.fixture(scope="module")
def gpu(comm):
    if comm.backend != "nccl":
        pytest.skip("CUDA tensors need backend nccl; this job runs %s" % comm.backend)
    # braid's nccl backend picks the device by local rank (BRAID_CUDA_DEVICE overrides); torch must agree
    torch.cuda.set_device(comm.rank % torch.cuda.device_count())
    return comm


def ranked(dtype, r, n=1000):
    i = torch.arange(n, device="cuda")
    return ((r + 1) * (i % 7 + 1)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                                   torch.int64, torch.uint8, torch.int8],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_all_reduce_sum(gpu, dtype):
    w = gpu.world_size
    x = ranked(dtype, gpu.rank)
    assert gpu.all_reduce(x, "sum") is x
    gpu.sync()
    want = sum(ranked(torch.float64, r) for r in range(w))
    assert torch.equal(x.double(), want)


def test_all_reduce_ops(gpu):
    r, w = gpu.rank, gpu.world_size
    x = torch.full((513,), float(r + 1), device="cuda")
    gpu.all_reduce(x, "max")
    y = torch.full((513,), float(r + 1), device="cuda")
    gpu.all_reduce(y, "min")
    z = torch.full((513,), float(2 * r + 2), device="cuda")
    gpu.all_reduce(z, "avg")
    gpu.sync()
    assert torch.all(x == w) and torch.all(y == 1) and torch.all(z == w + 1)


def test_broadcast_gather_scatter(gpu):
    r, w = gpu.rank, gpu.world_size
    b = torch.arange(300, dtype=torch.float32, device="cuda") * (r + 1)
    gpu.broadcast(b, root=w - 1)
    send = torch.arange(7, dtype=torch.int32, device="cuda") + 100 * r
    recv = torch.empty(7 * w, dtype=torch.int32, device="cuda")
    gpu.all_gather(send, recv)
    full = torch.ones(5 * w, dtype=torch.bfloat16, device="cuda") * (r + 1)
    part = torch.empty(5, dtype=torch.bfloat16, device="cuda")
    gpu.reduce_scatter(full, part, "sum")
    gpu.sync()
    assert torch.equal(b, torch.arange(300, dtype=torch.float32, device="cuda") * w)
    assert torch.equal(recv.cpu(), torch.cat([torch.arange(7, dtype=torch.int32) + 100 * q for q in range(w)]))
    assert torch.all(part == w * (w + 1) / 2)


def test_send_recv(gpu):
    r, w = gpu.rank, gpu.world_size
    out = torch.full((1 << 20,), r, dtype=torch.int16, device="cuda")
    got = torch.zeros(1 << 20, dtype=torch.int16, device="cuda")
    gpu.recv(got, src=(r - 1) % w, tag=3)
    gpu.send(out, dest=(r + 1) % w, tag=3)
    gpu.sync()
    assert torch.all(got == (r - 1) % w)


def test_stream_order(gpu):
    # The tensor is written by kernels queued behind a long one, on torch's
    # current stream and on a side stream; braid's stream must wait for them.
    w = gpu.world_size
    a = torch.randn(4096, 4096, device="cuda")
    for side in (False, True):
        s = torch.cuda.Stream() if side else torch.cuda.current_stream()
        with torch.cuda.stream(s):
            for _ in range(3):
                a = a @ a / 64
            x = torch.zeros(1 << 22, device="cuda")
            x.add_(1.0 + gpu.rank)
            gpu.all_reduce(x, "sum")
        gpu.sync()
        assert torch.all(x == w * (w + 1) / 2), "side stream" if side else "current stream"


def test_refusals(gpu):
    with pytest.raises(braid.UnsupportedError, match="i16"):
        gpu.all_reduce(torch.ones(4, dtype=torch.int16, device="cuda"), "sum")
    with pytest.raises(braid.InvalidArgumentError, match="not contiguous"):
        gpu.all_reduce(torch.ones(8, 8, device="cuda").t(), "sum")
    x = torch.ones(4, device="cuda")
    gpu.all_reduce(x)
    gpu.sync()
    assert torch.all(x == gpu.world_size)  # still usable after the refusals


def test_device_memory_as_tensor(gpu):
    m = gpu.mem_alloc(256, "float32")
    t = torch.as_tensor(m, device="cuda")
    t.fill_(gpu.rank + 1.0)
    gpu.all_reduce(t)
    gpu.sync()
    w = gpu.world_size
    assert torch.all(t == w * (w + 1) / 2)
    del t
    m.free()
