"""braid.init, braid.Communicator, braid.mem_alloc."""
import ctypes
import os
import threading
import weakref

from . import _buffers, _lib
from ._errors import InvalidArgumentError, Status, UnsupportedError, error_for
from ._types import DType, Op, as_op

SPLIT_NONE = 0xFFFFFFFF  # BRAID_SPLIT_NONE

# Calls whose NO_MEMORY/SYSTEM/BACKEND errors fail the communicator (docs/API.md).
_COLLECTIVE_CALLS = {"braid_all_reduce", "braid_broadcast", "braid_all_gather", "braid_reduce_scatter",
                     "braid_reduce", "braid_gather", "braid_scatter", "braid_all_to_all", "braid_barrier",
                     "braid_split"}


def _fatal(status, call, message):
    if status in (Status.TIMEOUT, Status.PEER_LOST, Status.ABORTED, Status.INTERNAL):
        return True
    if status == Status.MISMATCH:
        # a receive of another shape is not fatal; ranks in different collectives are
        return "but the receive expects" not in message
    if status in (Status.NO_MEMORY, Status.SYSTEM, Status.BACKEND):
        return call in _COLLECTIVE_CALLS
    return False


def _raise(lib, handle, status, call):
    msg = lib.braid_last_error(handle)
    msg = msg.decode("utf-8", "replace") if msg else "%s failed (status %d)" % (call, status)
    raise error_for(status, msg, _fatal(status, call, msg))


def _env_rank_note():
    r = os.environ.get("BRAID_RANK")
    return " (rank %s)" % r if r is not None else ""


def library_version():
    """Version of the libbraid in use ("MAJOR.MINOR.PATCH")."""
    return _lib.load().braid_version().decode()


def library_path():
    """Path of the libbraid in use."""
    return _lib.path()


def init(backend=None, rank=None, world_size=None, timeout=None, destroy_timeout=None, store=None, token=None,
         init_timeout=None, local_rank=None, local_size=None):
    """A new Communicator.

    With no arguments, everything comes from the environment, like
    ``braid_init(NULL, ...)``: braidrun's ``BRAID_*`` variables, or
    torchrun's, Slurm's or mpirun's; a lone process is a world of one
    (backend ``self``). Each argument overrides its variable (braid_config):
    backend ("self", "shm", "tcp", ...), rank, world_size, timeout (seconds a
    blocking call may wait without progress; 0 waits forever),
    destroy_timeout, store ("host:port"), token (64 hex digits),
    init_timeout, local_rank, local_size.

    Raises BootstrapError when the ranks cannot meet, InvalidArgumentError
    for bad settings.
    """
    lib = _lib.load()
    if world_size is not None and int(world_size) == 1 and local_size is None and local_rank is None:
        local_rank, local_size = 0, 1  # not the launcher's BRAID_LOCAL_* of a larger job
    args = (backend, rank, world_size, timeout, destroy_timeout, store, token, init_timeout, local_rank, local_size)
    cfgp = None
    keep = []
    if any(a is not None for a in args):
        cfg = _lib.braid_config()
        if backend is not None:
            keep.append(backend.encode())
            cfg.backend = keep[-1]
        if rank is not None:
            cfg.rank = int(rank)
        if world_size is not None:
            cfg.world_size = int(world_size)
        if timeout is not None:
            cfg.timeout_s = float(timeout)
        if destroy_timeout is not None:
            cfg.destroy_timeout_s = float(destroy_timeout)
        if store is not None:
            keep.append(store.encode())
            cfg.store_addr = keep[-1]
        if token is not None:
            keep.append(token.encode())
            cfg.token_hex = keep[-1]
        if local_rank is not None:
            cfg.local_rank = int(local_rank)
        if local_size is not None:
            cfg.local_size = int(local_size)
        if init_timeout is not None:
            cfg.init_timeout_s = float(init_timeout)
        cfgp = ctypes.byref(cfg)
    h = ctypes.c_void_p()
    st = lib.braid_init(cfgp, ctypes.byref(h))
    if st != 0:
        _raise(lib, None, st, "braid_init")
    return Communicator._wrap(lib, h.value)


class Communicator:
    """A braid communicator (braid_comm). Create one with ``braid.init()`` or
    ``Communicator.split``; release it with ``destroy()`` or a ``with`` block.

    Buffers are numpy arrays, PyTorch tensors (CPU, and CUDA on a backend
    that takes device memory), or anything else with the buffer protocol or
    DLPack; they must be C-contiguous, and writable where the call writes.
    The element type is the buffer's own; ``dtype=`` reads its bytes as
    another type of the same size (e.g. a uint16 array as bf16). Every call
    releases the GIL while it is in the library.

    Collectives complete before they return on the CPU backends; portable
    code calls ``sync()`` before reading results. ``send``/``recv`` are
    non-blocking: their buffers are kept referenced (so they cannot be freed)
    until ``sync()`` or ``barrier()`` completes them.
    """

    def __init__(self):
        raise TypeError("create a Communicator with braid.init() or Communicator.split()")

    @classmethod
    def _wrap(cls, lib, handle):
        self = object.__new__(cls)
        self._lib = lib
        self._h = handle
        self._lock = threading.Lock()
        self._pending = []
        self._rank = lib.braid_rank(handle)
        self._size = lib.braid_world_size(handle)
        self._backend = lib.braid_backend(handle).decode()
        self._stream = bool(lib.braid_has_stream_sync(handle))
        self._device_ok = self._stream or self._backend == "nccl"
        self._finalizer = weakref.finalize(self, _destroy_quietly, lib, handle)
        return self

    # ------------------------------------------------------------ properties

    @property
    def rank(self):
        """This process's rank, 0 to world_size - 1."""
        return self._rank

    @property
    def world_size(self):
        """The number of ranks."""
        return self._size

    @property
    def backend(self):
        """The backend's name: "self", "shm", "tcp", ..."""
        return self._backend

    @property
    def has_stream_sync(self):
        """Whether the backend runs collectives on a CUDA communication stream."""
        return self._stream

    @property
    def closed(self):
        return self._h is None

    def __repr__(self):
        if self._h is None:
            return "<braid.Communicator destroyed>"
        return "<braid.Communicator rank %d of %d, backend %s>" % (self._rank, self._size, self._backend)

    # ------------------------------------------------------------ helpers

    def _handle(self, call):
        h = self._h
        if h is None:
            raise InvalidArgumentError("%s: the communicator was destroyed (rank %d)" % (call, self._rank))
        return h

    def _note(self):
        return " (rank %d)" % self._rank

    def _buf(self, obj, writable, call, arg, dtype):
        b = _buffers.get(obj, writable, call, arg, self._note(), dtype)
        if b.device is not None and not self._device_ok:
            raise InvalidArgumentError(
                "%s: %s is in %s device memory, but backend %s takes host memory; use a backend for device "
                "memory (nccl) or move the data to the CPU%s" % (call, arg, b.device, self._backend, self._note()))
        return b

    def _op(self, op, call):
        try:
            return as_op(op)
        except ValueError as e:
            raise InvalidArgumentError("%s: op=%s%s" % (call, e, self._note())) from None

    def _check(self, st, h, call):
        if st != 0:
            _raise(self._lib, h, st, call)

    def _hold(self, *bufs):
        with self._lock:
            self._pending.extend(bufs)

    def _release_pending(self):
        with self._lock:
            self._pending.clear()

    # ------------------------------------------------------------ collectives

    def all_reduce(self, buf, op=Op.SUM, dtype=None):
        """Reduces buf across ranks, in place; every rank gets bitwise-identical
        results. op: braid.Op or a name ("sum", "prod", "min", "max", "avg",
        "band", "bor", "bxor"). Returns buf."""
        call = "braid_all_reduce"
        h = self._handle(call)
        o = self._op(op, call)
        b = self._buf(buf, True, call, "buf", dtype)
        self._check(self._lib.braid_all_reduce(h, b.addr, b.count(b.dtype), int(b.dtype), int(o)), h, call)
        if self._stream:
            self._hold(b)
        return buf

    def broadcast(self, buf, root=0, dtype=None):
        """Copies root's buf to every rank's buf. Returns buf."""
        call = "braid_broadcast"
        h = self._handle(call)
        b = self._buf(buf, True, call, "buf", dtype)
        self._check(self._lib.braid_broadcast(h, b.addr, b.count(b.dtype), int(b.dtype), int(root)), h, call)
        if self._stream:
            self._hold(b)
        return buf

    def all_gather(self, send, recv, dtype=None):
        """Rank r's send lands at block r of recv, which holds world_size
        blocks of send's size. In place when send is this rank's block of
        recv (e.g. ``recv[rank*n:(rank+1)*n]``). Returns recv."""
        call = "braid_all_gather"
        h = self._handle(call)
        s = self._buf(send, False, call, "send", dtype)
        r = self._buf(recv, True, call, "recv", dtype)
        if r.dtype != s.dtype:
            raise InvalidArgumentError("%s: send holds %s elements but recv holds %s%s"
                                       % (call, s.dtype, r.dtype, self._note()))
        n = s.count(s.dtype)
        if r.nbytes != s.nbytes * self._size:
            raise InvalidArgumentError(
                "%s: recv holds %d elements of %s but must hold %d (%d ranks x %d)%s"
                % (call, r.count(r.dtype), r.dtype, n * self._size, self._size, n, self._note()))
        self._check(self._lib.braid_all_gather(h, s.addr, r.addr, n, int(s.dtype)), h, call)
        if self._stream:
            self._hold(s, r)
        return recv

    def reduce_scatter(self, send, recv, op=Op.SUM, dtype=None):
        """send holds world_size blocks of recv's size; rank r receives the
        reduction of every rank's block r. In place when recv is this rank's
        block of send. Returns recv."""
        call = "braid_reduce_scatter"
        h = self._handle(call)
        o = self._op(op, call)
        s = self._buf(send, False, call, "send", dtype)
        r = self._buf(recv, True, call, "recv", dtype)
        if r.dtype != s.dtype:
            raise InvalidArgumentError("%s: send holds %s elements but recv holds %s%s"
                                       % (call, s.dtype, r.dtype, self._note()))
        n = r.count(r.dtype)
        if s.nbytes != r.nbytes * self._size:
            raise InvalidArgumentError(
                "%s: send holds %d elements of %s but must hold %d (%d ranks x %d)%s"
                % (call, s.count(s.dtype), s.dtype, n * self._size, self._size, n, self._note()))
        self._check(self._lib.braid_reduce_scatter(h, s.addr, r.addr, n, int(s.dtype), int(o)), h, call)
        if self._stream:
            self._hold(s, r)
        return recv

    def _optional_fn(self, call):
        f = getattr(self._lib, call, None)  # None: a libbraid older than this package
        if f is None:
            raise UnsupportedError("%s: the libbraid in use (%s, version %s) does not have this call%s"
                                   % (call, _lib.path(), library_version(), self._note()))
        return f

    def _root(self, root, call):
        r = int(root)
        if not 0 <= r < self._size:
            raise InvalidArgumentError("%s: root %d out of range for world size %d%s"
                                       % (call, r, self._size, self._note()))
        return r

    def _same_dtype(self, s, r, call):
        if r.dtype != s.dtype:
            raise InvalidArgumentError("%s: send holds %s elements but recv holds %s%s"
                                       % (call, s.dtype, r.dtype, self._note()))

    def reduce(self, send, recv=None, op=Op.SUM, root=0, dtype=None):
        """Reduces every rank's send into root's recv (send's size and type).
        recv is used at the root only (other ranks may pass None); in place
        at the root when recv is send or None. Returns recv (send when in
        place), or None on other ranks when recv is None."""
        call = "braid_reduce"
        h = self._handle(call)
        f = self._optional_fn(call)
        o = self._op(op, call)
        root = self._root(root, call)
        at_root = self._rank == root
        if at_root and recv is None:
            recv = send
        s = self._buf(send, at_root and recv is send, call, "send", dtype)
        r = s
        if at_root and recv is not send:
            r = self._buf(recv, True, call, "recv", dtype)
            self._same_dtype(s, r, call)
            if r.nbytes != s.nbytes:
                raise InvalidArgumentError("%s: recv holds %d elements of %s but must hold %d, as send does%s"
                                           % (call, r.count(r.dtype), r.dtype, s.count(s.dtype), self._note()))
        self._check(f(h, s.addr, r.addr if at_root else None, s.count(s.dtype), int(s.dtype), int(o), root), h, call)
        if self._stream:
            self._hold(s, r)
        return recv

    def gather(self, send, recv=None, root=0, dtype=None):
        """Rank r's send lands at block r of root's recv, which holds
        world_size blocks of send's size; recv is used at the root only
        (other ranks may pass None). In place at the root when send is its
        own block of recv. Returns recv."""
        call = "braid_gather"
        h = self._handle(call)
        f = self._optional_fn(call)
        root = self._root(root, call)
        s = self._buf(send, False, call, "send", dtype)
        n = s.count(s.dtype)
        raddr = None
        r = None
        if self._rank == root:
            if recv is None:
                raise InvalidArgumentError("%s: recv is None at the root%s" % (call, self._note()))
            r = self._buf(recv, True, call, "recv", dtype)
            self._same_dtype(s, r, call)
            if r.nbytes != s.nbytes * self._size:
                raise InvalidArgumentError(
                    "%s: recv holds %d elements of %s but must hold %d (%d ranks x %d)%s"
                    % (call, r.count(r.dtype), r.dtype, n * self._size, self._size, n, self._note()))
            raddr = r.addr
        self._check(f(h, s.addr, raddr, n, int(s.dtype), root), h, call)
        if self._stream:
            self._hold(s, r)
        return recv

    def scatter(self, send, recv, root=0, dtype=None):
        """Rank r receives block r of root's send (world_size blocks of
        recv's size) into recv; send is used at the root only (other ranks
        may pass None). In place at the root when recv is its own block of
        send. Returns recv."""
        call = "braid_scatter"
        h = self._handle(call)
        f = self._optional_fn(call)
        root = self._root(root, call)
        r = self._buf(recv, True, call, "recv", dtype)
        n = r.count(r.dtype)
        saddr = None
        s = None
        if self._rank == root:
            if send is None:
                raise InvalidArgumentError("%s: send is None at the root%s" % (call, self._note()))
            s = self._buf(send, False, call, "send", dtype)
            self._same_dtype(s, r, call)
            if s.nbytes != r.nbytes * self._size:
                raise InvalidArgumentError(
                    "%s: send holds %d elements of %s but must hold %d (%d ranks x %d)%s"
                    % (call, s.count(s.dtype), s.dtype, n * self._size, self._size, n, self._note()))
            saddr = s.addr
        self._check(f(h, saddr, r.addr, n, int(r.dtype), root), h, call)
        if self._stream:
            self._hold(s, r)
        return recv

    def all_to_all(self, send, recv, dtype=None):
        """send and recv hold world_size blocks of the same size: block j of
        rank i lands as block i of rank j. In place when recv is send.
        Returns recv."""
        call = "braid_all_to_all"
        h = self._handle(call)
        f = self._optional_fn(call)
        r = self._buf(recv, True, call, "recv", dtype)
        s = r if send is recv else self._buf(send, False, call, "send", dtype)
        self._same_dtype(s, r, call)
        if s.nbytes != r.nbytes:
            raise InvalidArgumentError("%s: send holds %d elements of %s but recv holds %d; both hold world_size "
                                       "blocks of one size%s"
                                       % (call, s.count(s.dtype), s.dtype, r.count(r.dtype), self._note()))
        total = s.count(s.dtype)
        if total % self._size:
            raise InvalidArgumentError("%s: send holds %d elements, not a multiple of the world size %d%s"
                                       % (call, total, self._size, self._note()))
        self._check(f(h, s.addr, r.addr, total // self._size, int(s.dtype)), h, call)
        if self._stream:
            self._hold(s, r)
        return recv

    # ------------------------------------------------------------ point to point

    def send(self, buf, dest, tag=0, dtype=None):
        """Posts a send of buf to rank dest (non-blocking). Do not modify buf
        until sync() or barrier(); braid keeps it referenced until then."""
        call = "braid_send"
        h = self._handle(call)
        b = self._buf(buf, False, call, "buf", dtype)
        self._hold(b)
        self._check(self._lib.braid_send(h, b.addr, b.count(b.dtype), int(b.dtype), int(dest), int(tag)), h, call)

    def recv(self, buf, src, tag=0, dtype=None):
        """Posts a receive into buf from rank src (non-blocking). buf holds the
        message after sync() or barrier(). A message of another size or type
        raises MismatchError (from recv or from the sync that completes it)
        naming both sizes; the message stays for a receive of the right shape."""
        call = "braid_recv"
        h = self._handle(call)
        b = self._buf(buf, True, call, "buf", dtype)
        self._hold(b)
        self._check(self._lib.braid_recv(h, b.addr, b.count(b.dtype), int(b.dtype), int(src), int(tag)), h, call)

    def sync(self):
        """Completes every pending operation of this rank."""
        call = "braid_sync"
        h = self._handle(call)
        self._check(self._lib.braid_sync(h), h, call)
        self._release_pending()

    def barrier(self):
        """sync(), then waits until every rank has reached the barrier."""
        call = "braid_barrier"
        h = self._handle(call)
        self._check(self._lib.braid_barrier(h), h, call)
        self._release_pending()

    # ------------------------------------------------------------ communicators

    def split(self, color, key=0):
        """Collective: ranks with the same color form a new Communicator,
        ranked by (key, old rank). color None (or braid.SPLIT_NONE): this rank
        joins none, and gets None."""
        call = "braid_split"
        h = self._handle(call)
        c = SPLIT_NONE if color is None else int(color)
        out = ctypes.c_void_p()
        self._check(self._lib.braid_split(h, c, int(key), ctypes.byref(out)), h, call)
        return Communicator._wrap(self._lib, out.value) if out.value else None

    def abort(self):
        """Fails the communicator, from any thread at any time: a call blocked
        in it (another thread's) and every later call raise AbortedError, and
        the other ranks' calls raise PeerLostError naming this rank. Release it
        with destroy()."""
        call = "braid_abort"
        h = self._handle(call)
        self._check(self._lib.braid_abort(h), h, call)

    def destroy(self):
        """Completes pending work (bounded by BRAID_DESTROY_TIMEOUT) and frees
        the communicator. Idempotent."""
        with self._lock:
            h, self._h = self._h, None
        if h is None:
            return
        self._finalizer.detach()
        st = self._lib.braid_destroy(h)
        self._release_pending()
        if st != 0:
            _raise(self._lib, None, st, "braid_destroy")

    close = destroy

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()
        return False

    # ------------------------------------------------------------ CUDA stream hooks

    def _hook(self, name, *args):
        h = self._handle(name)
        self._check(getattr(self._lib, name)(h, *args), h, name)

    def event_create(self):
        """A CUDA event handle (timing disabled); UnsupportedError without a communication stream."""
        ev = ctypes.c_uint64()
        self._hook("braid_event_create", ctypes.byref(ev))
        return ev.value

    def event_destroy(self, event):
        self._hook("braid_event_destroy", int(event))

    def event_record_on_comm_stream(self, event):
        self._hook("braid_event_record_on_comm_stream", int(event))

    def event_record_on_stream(self, event, stream):
        """stream: a cudaStream_t value (torch: ``torch.cuda.current_stream().cuda_stream``)."""
        self._hook("braid_event_record_on_stream", int(event), int(stream))

    def comm_stream_wait_event(self, event):
        self._hook("braid_comm_stream_wait_event", int(event))

    def stream_wait_event(self, stream, event):
        self._hook("braid_stream_wait_event", int(stream), int(event))

    def sync_comm_stream(self):
        self._hook("braid_sync_comm_stream")


def _destroy_quietly(lib, handle):
    """A Communicator garbage-collected without destroy(): braid_destroy's
    bounded best-effort sync; braid logs what it abandons. Never raises."""
    try:
        lib.braid_destroy(handle)
    except Exception:
        pass


# ------------------------------------------------------------ braid memory


def _mem_free_quietly(lib, ptr):
    try:
        lib.braid_mem_free(ptr)
    except Exception:
        pass


def mem_alloc(shape, dtype="float32"):
    """A zero-filled numpy array over braid memory (braid_mem_alloc): memory
    every backend takes, and that the shm backend's peers read in place
    instead of through staging. shape: an int or a tuple; dtype: a numpy
    dtype (or anything numpy.dtype accepts). The memory is freed with
    braid_mem_free when the array and every view of it are gone. Requires
    numpy."""
    import numpy

    lib = _lib.load()
    dt = numpy.dtype(dtype)
    shp = (int(shape),) if isinstance(shape, int) or hasattr(shape, "__index__") else tuple(int(s) for s in shape)
    n = 1
    for s in shp:
        if s < 0:
            raise InvalidArgumentError("braid_mem_alloc: negative dimension in shape %s%s" % (shp, _env_rank_note()))
        n *= s
    nbytes = n * dt.itemsize
    ptr = ctypes.c_void_p()
    st = lib.braid_mem_alloc(ctypes.byref(ptr), max(nbytes, 1))
    if st != 0:
        _raise(lib, None, st, "braid_mem_alloc")
    raw = (ctypes.c_char * max(nbytes, 1)).from_address(ptr.value)
    weakref.finalize(raw, _mem_free_quietly, lib, ptr.value)
    arr = numpy.frombuffer(raw, dtype=dt, count=n).reshape(shp)
    return arr


__all__ = ["init", "Communicator", "mem_alloc", "library_version", "library_path", "SPLIT_NONE", "DType", "Op"]
