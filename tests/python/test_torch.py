"""PyTorch tensors through DLPack: dtypes numpy lacks (bfloat16), bool,
complex, views, parameters that require grad, refused layouts."""
import pytest

import braid
from conftest import assert_same_on_every_rank

torch = pytest.importorskip("torch", reason="PyTorch (Debian: python3-torch) is not installed")


def small(dtype, r, n=23):
    i = torch.arange(n)
    v = (r + 1) * (i % 5 + 1)
    if dtype == torch.bool:
        return (i + r) % 3 == 0
    if dtype.is_complex:
        return (v + 1j * (r - i % 3)).to(dtype)
    return v.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                   torch.int32, torch.int16, torch.int8, torch.uint8, torch.complex64,
                                   torch.complex128, torch.bool],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_all_reduce_sum(comm, dtype):
    x = small(dtype, comm.rank)
    assert comm.all_reduce(x, "sum") is x
    comm.sync()
    ins = [small(dtype, r) for r in range(comm.world_size)]
    if dtype == torch.bool:
        want = ins[0]
        for t in ins[1:]:
            want = want | t
    else:
        want = sum(ins[1:], ins[0])
    assert x.dtype == dtype
    assert torch.equal(x, want), "rank %d: %s got %s want %s" % (comm.rank, dtype, x, want)


def test_bfloat16_avg_identical_bits(comm):
    g = torch.Generator().manual_seed(77 + comm.rank)
    x = torch.randn(4099, generator=g).to(torch.bfloat16)
    comm.all_reduce(x, braid.AVG)
    comm.sync()
    assert x.dtype == torch.bfloat16
    assert_same_on_every_rank(comm, x.view(torch.int16).numpy())
    # the average of identical inputs is the input (exact in bf16 for any world size we run)
    y = torch.full((8,), 1.5, dtype=torch.bfloat16)
    comm.all_reduce(y, "avg")
    comm.sync()
    assert torch.all(y == 1.5)


def test_parameter_that_requires_grad(comm):
    p = torch.nn.Parameter(torch.full((3, 4), float(comm.rank + 1)))
    comm.all_reduce(p, "sum")  # exported through p.detach(): the same memory
    comm.sync()
    assert p.requires_grad
    assert torch.all(p.detach() == comm.world_size * (comm.world_size + 1) / 2)


def test_views(comm):
    base = torch.zeros(20, dtype=torch.int32)
    view = base[5:10]  # contiguous, with a storage offset
    view += comm.rank + 1
    comm.all_reduce(view)
    comm.sync()
    s = comm.world_size * (comm.world_size + 1) // 2
    assert base[:5].eq(0).all() and base[5:10].eq(s).all() and base[10:].eq(0).all()
    m = torch.zeros(4, 6)
    with pytest.raises(braid.InvalidArgumentError) as ei:
        comm.all_reduce(m.t())
    assert str(ei.value).startswith("braid_all_reduce: buf is not contiguous (shape (6, 4), strides (1, 6) elements)")
    assert "t.contiguous()" in str(ei.value)
    with pytest.raises(braid.InvalidArgumentError, match="not contiguous"):
        comm.broadcast(m[:, 1], root=0)
    e = torch.zeros(0)
    comm.all_reduce(e)  # count 0 is a no-op
    comm.broadcast(m[1], root=0)  # a contiguous row
    comm.sync()


def test_broadcast_model(comm):
    torch.manual_seed(comm.rank)  # different initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    for p in model.parameters():
        comm.broadcast(p, root=0)
    comm.sync()
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.detach(), q.detach())


def test_all_gather_and_reduce_scatter(comm):
    w = comm.world_size
    send = torch.arange(6, dtype=torch.float64) + 10 * comm.rank
    recv = torch.empty(6 * w, dtype=torch.float64)
    comm.all_gather(send, recv)
    comm.sync()
    assert torch.equal(recv, torch.cat([torch.arange(6, dtype=torch.float64) + 10 * r for r in range(w)]))
    full = torch.ones(3 * w, dtype=torch.bfloat16) * (comm.rank + 1)
    part = torch.empty(3, dtype=torch.bfloat16)
    comm.reduce_scatter(full, part, "sum")
    comm.sync()
    assert torch.all(part == w * (w + 1) / 2)


def test_send_recv_tensors(comm):
    r, w = comm.rank, comm.world_size
    out = torch.full((100,), r, dtype=torch.int16)
    got = torch.empty(100, dtype=torch.int16)
    comm.recv(got, src=(r - 1) % w, tag=3)
    comm.send(out, dest=(r + 1) % w, tag=3)
    comm.sync()
    assert torch.all(got == (r - 1) % w)


def test_numpy_and_torch_share_memory(comm):
    # a numpy view of a tensor goes through the buffer protocol: same memory
    t = torch.full((5,), comm.rank + 1.0)
    comm.all_reduce(t.numpy())
    comm.sync()
    assert torch.all(t == comm.world_size * (comm.world_size + 1) / 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tensor_needs_a_device_backend(comm):
    x = torch.zeros(4, device="cuda")
    if comm.backend == "nccl":
        comm.all_reduce(x)
        comm.sync()
        torch.cuda.synchronize()
    else:
        with pytest.raises(braid.InvalidArgumentError, match="device memory, but backend %s" % comm.backend):
            comm.all_reduce(x)


def test_torch_names(comm):
    import torch.distributed as dist

    assert braid.as_op(dist.ReduceOp.AVG) is braid.AVG and braid.as_op(dist.ReduceOp.PRODUCT) is braid.PROD
    assert braid.as_dtype(torch.bfloat16) is braid.DType.BF16 and braid.as_dtype(torch.complex128) is braid.DType.C128
    x = torch.tensor([float(comm.rank)])
    comm.all_reduce(x, dist.ReduceOp.MAX)
    comm.sync()
    assert x.item() == comm.world_size - 1
