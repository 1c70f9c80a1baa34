"""braid.init, braid.Communicator, braid.mem_alloc, and the Communicator's
memory (DeviceMemory) and registrations (Registration)."""
import ctypes
import functools
import itertools
import os
import threading
import weakref

from . import _buffers, _lib
from ._errors import InvalidArgumentError, Status, UnsupportedError, error_for
from ._types import DType, Op, as_dtype, as_op

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


def _error(lib, handle, status, call):
    msg = lib.braid_last_error(handle)
    msg = msg.decode("utf-8", "replace") if msg else "%s failed (status %d)" % (call, status)
    return error_for(status, msg, _fatal(status, call, msg))


def _raise(lib, handle, status, call):
    raise _error(lib, handle, status, call)


_INT_MIN, _INT_MAX, _U32_MAX = -2**31, 2**31 - 1, 2**32 - 1


def _c_int(value, call, arg, note):
    """value as a C int, or InvalidArgumentError: ctypes would wrap it."""
    v = int(value)
    if not _INT_MIN <= v <= _INT_MAX:
        raise InvalidArgumentError("%s: %s %d does not fit a C int (%d to %d)%s" % (call, arg, v, _INT_MIN, _INT_MAX,
                                                                                   note))
    return v


def _c_u32(value, call, arg, note):
    """value as a uint32_t, or InvalidArgumentError: ctypes would wrap it."""
    v = int(value)
    if not 0 <= v <= _U32_MAX:
        raise InvalidArgumentError("%s: %s %d is not a 32-bit unsigned value (0 to %d)%s" % (call, arg, v, _U32_MAX,
                                                                                            note))
    return v


def _in_call(fn):
    """Counts fn's calls in flight, so that destroy() never frees the
    communicator under another thread's call."""
    @functools.wraps(fn)
    def run(self, *args, **kwargs):
        with self._lock:
            self._calls += 1
        try:
            return fn(self, *args, **kwargs)
        finally:
            with self._lock:
                self._calls -= 1
    return run


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
            cfg.rank = _c_int(rank, "braid_init", "rank", _env_rank_note())
        if world_size is not None:
            cfg.world_size = _c_int(world_size, "braid_init", "world_size", _env_rank_note())
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
            cfg.local_rank = _c_int(local_rank, "braid_init", "local_rank", _env_rank_note())
        if local_size is not None:
            cfg.local_size = _c_int(local_size, "braid_init", "local_size", _env_rank_note())
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
        self._calls = 0  # calls in flight in any thread (_in_call)
        self._pending = []  # (hold number, buffers) of operations not yet known complete
        self._held = 0
        self._rank = lib.braid_rank(handle)
        self._size = lib.braid_world_size(handle)
        self._backend = lib.braid_backend(handle).decode()
        self._stream = bool(lib.braid_has_stream_sync(handle))
        self._device_ok = self._stream or self._backend == "nccl"
        self._device_mem = self._backend == "nccl"  # braid_comm_mem_alloc gives device memory
        self._ready_event = None  # orders the communication stream after a device buffer's producer
        # Memory of mem_alloc and registrations of register() not yet released:
        # key -> (kind "host" / "device" / "reg", pointer or handle, objects it pins).
        self._mem_lock = threading.RLock()
        self._owned = {}
        self._keys = itertools.count()
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
        if b.device is not None and self._stream:
            self._after_producer(obj)
        return b

    def _after_producer(self, obj):
        # braid's communication stream is non-blocking, so nothing orders it
        # after the kernels that wrote a tensor: make it wait for the stream
        # the array library is producing on (as torch.distributed does).
        s = _buffers.producer_stream(obj)
        if s is None:
            return
        if self._ready_event is None:
            self._ready_event = self.event_create()
        self.event_record_on_stream(self._ready_event, s)
        self.comm_stream_wait_event(self._ready_event)

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
            self._held += 1
            self._pending.append((self._held, bufs))

    def _holds(self):
        """The number of the newest hold: a sync that starts now completes
        the operations of every hold up to it, not those posted later by
        another thread."""
        with self._lock:
            return self._held

    def _release_pending(self, upto=None):
        with self._lock:
            self._pending = [] if upto is None else [e for e in self._pending if e[0] > upto]

    # ------------------------------------------------------------ collectives

    @_in_call
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

    @_in_call
    def broadcast(self, buf, root=0, dtype=None):
        """Copies root's buf to every rank's buf. Returns buf."""
        call = "braid_broadcast"
        h = self._handle(call)
        b = self._buf(buf, True, call, "buf", dtype)
        root = _c_int(root, call, "root", self._note())
        self._check(self._lib.braid_broadcast(h, b.addr, b.count(b.dtype), int(b.dtype), root), h, call)
        if self._stream:
            self._hold(b)
        return buf

    @_in_call
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

    @_in_call
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
        r = _c_int(root, call, "root", self._note())
        if not 0 <= r < self._size:
            raise InvalidArgumentError("%s: root %d out of range for world size %d%s"
                                       % (call, r, self._size, self._note()))
        return r

    def _same_dtype(self, s, r, call):
        if r.dtype != s.dtype:
            raise InvalidArgumentError("%s: send holds %s elements but recv holds %s%s"
                                       % (call, s.dtype, r.dtype, self._note()))

    @_in_call
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

    @_in_call
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

    @_in_call
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

    @_in_call
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

    @_in_call
    def send(self, buf, dest, tag=0, dtype=None):
        """Posts a send of buf to rank dest (non-blocking). Do not modify buf
        until sync() or barrier(); braid keeps it referenced until then."""
        call = "braid_send"
        h = self._handle(call)
        dest, tag = _c_int(dest, call, "dest", self._note()), _c_u32(tag, call, "tag", self._note())
        b = self._buf(buf, False, call, "buf", dtype)
        self._check(self._lib.braid_send(h, b.addr, b.count(b.dtype), int(b.dtype), dest, tag), h, call)
        self._hold(b)  # after the post: a sync that began before it must not release it

    @_in_call
    def recv(self, buf, src, tag=0, dtype=None):
        """Posts a receive into buf from rank src (non-blocking). buf holds the
        message after sync() or barrier(). A message of another size or type
        raises MismatchError (from recv or from the sync that completes it)
        naming both sizes; the message stays for a receive of the right shape."""
        call = "braid_recv"
        h = self._handle(call)
        src, tag = _c_int(src, call, "src", self._note()), _c_u32(tag, call, "tag", self._note())
        b = self._buf(buf, True, call, "buf", dtype)
        self._check(self._lib.braid_recv(h, b.addr, b.count(b.dtype), int(b.dtype), src, tag), h, call)
        self._hold(b)  # as in send

    @_in_call
    def sync(self):
        """Completes every pending operation of this rank."""
        call = "braid_sync"
        h = self._handle(call)
        upto = self._holds()
        self._check(self._lib.braid_sync(h), h, call)
        self._release_pending(upto)

    @_in_call
    def barrier(self):
        """sync(), then waits until every rank has reached the barrier."""
        call = "braid_barrier"
        h = self._handle(call)
        upto = self._holds()
        self._check(self._lib.braid_barrier(h), h, call)
        self._release_pending(upto)

    # ------------------------------------------------------------ communicators

    @_in_call
    def split(self, color, key=0):
        """Collective: ranks with the same color form a new Communicator,
        ranked by (key, old rank). color None (or braid.SPLIT_NONE): this rank
        joins none, and gets None."""
        call = "braid_split"
        h = self._handle(call)
        c = SPLIT_NONE if color is None else _c_u32(color, call, "color", self._note())
        key = _c_u32(key, call, "key", self._note())
        out = ctypes.c_void_p()
        self._check(self._lib.braid_split(h, c, key, ctypes.byref(out)), h, call)
        return Communicator._wrap(self._lib, out.value) if out.value else None

    @_in_call
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
        the communicator. Idempotent. Registrations still open are ended and
        device memory of mem_alloc still held is freed first; host memory of
        mem_alloc stays valid for as long as its arrays live."""
        with self._mem_lock:
            with self._lock:
                if self._h is not None and self._calls:
                    raise InvalidArgumentError(
                        "braid_destroy: %d call(s) on this communicator are still running in other threads; destroy "
                        "it after they return (abort() makes a blocked one return at once)%s"
                        % (self._calls, self._note()))
                h, self._h = self._h, None
            if h is None:
                return
            # newest first: a registration before the memory it covers
            for key in sorted(self._owned, reverse=True):
                kind, ptr, _ = self._owned[key]
                if kind != "host":
                    del self._owned[key]
                    fn = "braid_mem_deregister" if kind == "reg" else "braid_comm_mem_free"
                    getattr(self._lib, fn)(h, ptr)  # best effort, as braid_destroy's own sync
        self._finalizer.detach()
        if self._ready_event is not None:
            self._lib.braid_event_destroy(h, self._ready_event)  # best effort, as above
            self._ready_event = None
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

    @_in_call
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

    # ------------------------------------------------------------ memory and registration

    def mem_alloc(self, shape, dtype="float32"):
        """Communication memory that suits this communicator's backend
        (braid_comm_mem_alloc), for an array of shape (an int or a tuple) and
        dtype (a numpy dtype, or anything numpy.dtype accepts). Requires numpy.

        Host backends (every backend but nccl): braid_mem_alloc's memory, as
        a zero-filled numpy array (like braid.mem_alloc: the shm backend's
        peers read it in place). It is freed with braid_comm_mem_free when the
        array and every view of it are gone (with braid_mem_free, the same
        thing on these backends, if the communicator was destroyed first); until
        then it keeps this Communicator object alive.

        nccl: device memory (ncclMemAlloc, on the current CUDA device), which
        numpy cannot address, as a DeviceMemory: collectives take it as a
        buffer, it exports ``__cuda_array_interface__`` (torch.as_tensor(m,
        device="cuda"), CuPy), and it is freed by ``free()``, at the end of a
        ``with`` block, when it is garbage-collected, or by destroy(),
        whichever comes first. It is not zero-filled."""
        import numpy

        call = "braid_comm_mem_alloc"
        self._handle(call)
        f = self._optional_fn(call)
        try:
            dt = numpy.dtype(dtype)
        except TypeError as e:
            raise InvalidArgumentError("%s: dtype=%r: %s%s" % (call, dtype, e, self._note())) from None
        shp = _shape(shape, call, self._note())
        n = 1
        for s in shp:
            n *= s
        nbytes = n * dt.itemsize
        ptr = ctypes.c_void_p()
        with self._mem_lock:  # recorded before a destroy() can look
            h = self._handle(call)
            self._check(f(h, ctypes.byref(ptr), max(nbytes, 1)), h, call)
            key = self._own("device" if self._device_mem else "host", ptr.value, None)
        if self._device_mem:
            return DeviceMemory._make(self, key, ptr.value, nbytes, shp, dt)
        raw = (ctypes.c_char * max(nbytes, 1)).from_address(ptr.value)
        # Not at exit: arrays over it may outlive the interpreter's atexit
        # handlers (the process's end frees it anyway).
        weakref.finalize(raw, self._release, key).atexit = False
        return numpy.frombuffer(raw, dtype=dt, count=n).reshape(shp)

    def register(self, buf):
        """Registers buf with this communicator for its zero-copy paths
        (braid_mem_register: ncclCommRegister on nccl; on the other backends
        there is nothing to register and the handle is a token) and returns a
        Registration. buf: anything a collective takes, a DeviceMemory
        included; it stays referenced while it is registered. End it with
        ``deregister()`` or a ``with`` block; a Registration garbage-collected
        while registered is deregistered then, and destroy() ends every
        registration still open. Optional: unregistered buffers work on every
        backend."""
        call = "braid_mem_register"
        self._handle(call)
        f = self._optional_fn(call)
        b = self._buf(buf, False, call, "buf", None)
        handle = ctypes.c_void_p()
        with self._mem_lock:
            h = self._handle(call)
            self._check(f(h, b.addr, b.nbytes, ctypes.byref(handle)), h, call)
            key = self._own("reg", handle.value, b)
        return Registration._make(self, key, handle.value, b.addr, b.nbytes)

    def _own(self, kind, ptr, keep):
        key = next(self._keys)
        self._owned[key] = (kind, ptr, keep)
        return key

    def _release(self, key, call=None):
        """Frees memory of mem_alloc (braid_comm_mem_free) or ends a
        registration (braid_mem_deregister). call (an explicit free() or
        deregister()): braid's error is raised; without (garbage collection)
        nothing is raised."""
        err = None
        with self._mem_lock:
            entry = self._owned.pop(key, None)
            if entry is None:
                return
            kind, ptr = entry[0], entry[1]
            del entry  # what it pins goes now, not with a traceback that holds this frame
            try:
                h = self._h
                if h is None:
                    # destroyed: destroy() released device memory and registrations
                    if kind == "host":
                        self._lib.braid_mem_free(ptr)
                    return
                fn = "braid_mem_deregister" if kind == "reg" else "braid_comm_mem_free"
                st = getattr(self._lib, fn)(h, ptr)
                if st != 0:
                    err = _error(self._lib, h, st, fn)
                    if kind == "host":
                        # a failed communicator refuses every call; the memory is braid_mem_alloc's
                        self._lib.braid_mem_free(ptr)
            except Exception:
                if call is not None:
                    raise
        if err is not None and call is not None:
            raise err


def _destroy_quietly(lib, handle):
    """A Communicator garbage-collected without destroy(): braid_destroy's
    bounded best-effort sync; braid logs what it abandons. Never raises."""
    try:
        lib.braid_destroy(handle)
    except Exception:
        pass


# ------------------------------------------------------------ memory of a communicator


class _Held:
    """Something a Communicator hands out and releases (its key in the
    communicator's table): released when garbage-collected at the latest."""

    __slots__ = ("_comm", "_key", "_finalizer", "__weakref__")

    @classmethod
    def _held(cls, comm, key, **fields):
        self = object.__new__(cls)
        self._comm = comm
        self._key = key
        for name, value in fields.items():
            setattr(self, name, value)
        self._finalizer = weakref.finalize(self, comm._release, key)
        return self

    def _live(self):
        return self._key in self._comm._owned

    def _end(self):  # free() or deregister()
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        with self._comm._mem_lock:
            if self._live():
                self._end()
        return False


class DeviceMemory(_Held):
    """Device memory of ``Communicator.mem_alloc`` on backend nccl
    (braid_comm_mem_alloc: ncclMemAlloc, on the current CUDA device), typed
    as an array of ``shape`` and ``dtype`` (a numpy dtype). numpy cannot
    address it; collectives of a device backend take it as a buffer, and it
    exports ``__cuda_array_interface__`` (version 3) for torch.as_tensor(m,
    device="cuda") and CuPy, which must not use it after it is freed.

    ``ptr`` (int) and ``nbytes`` give the allocation. ``free()`` (or the end
    of a ``with`` block) frees it with braid_comm_mem_free; otherwise that
    happens when it is garbage-collected or when the communicator is
    destroyed, whichever comes first. Deregister a registration of it first.
    """

    __slots__ = ("ptr", "nbytes", "shape", "dtype")

    def __init__(self):
        raise TypeError("DeviceMemory comes from Communicator.mem_alloc on backend nccl")

    @classmethod
    def _make(cls, comm, key, ptr, nbytes, shape, dtype):
        return cls._held(comm, key, ptr=ptr, nbytes=nbytes, shape=shape, dtype=dtype)

    @property
    def freed(self):
        """Whether the memory was freed (by free() or by the communicator's destroy())."""
        return not self._live()

    def _gone(self, call, arg=None):
        what = "%s (device memory at 0x%x)" % (arg, self.ptr) if arg else "device memory at 0x%x" % self.ptr
        return InvalidArgumentError("%s: %s was freed already%s" % (call, what, self._comm._note()))

    def free(self):
        """Frees the memory (braid_comm_mem_free). Freeing it twice, or after
        the communicator's destroy() freed it, raises InvalidArgumentError."""
        call = "braid_comm_mem_free"
        c = self._comm
        with c._mem_lock:
            c._handle(call)
            if self.freed:
                raise self._gone(call)
            regs = [e[1] for e in c._owned.values() if e[0] == "reg" and self in e[2].keep]
            if regs:
                raise InvalidArgumentError("%s: device memory at 0x%x is still registered (handle 0x%x); "
                                           "deregister it first%s" % (call, self.ptr, regs[0] or 0, c._note()))
            self._finalizer.detach()
            c._release(self._key, call)

    _end = free

    @property
    def __cuda_array_interface__(self):
        if self.freed:
            raise self._gone("__cuda_array_interface__")
        return {"shape": self.shape, "typestr": self.dtype.str, "descr": self.dtype.descr, "data": (self.ptr, False),
                "strides": None, "version": 3}

    def _braid_buffer(self, call, arg, rank_note):
        """The Buffer of a braid call (braid._buffers.get)."""
        if self.freed:
            raise self._gone(call, arg)
        try:
            dt = as_dtype(self.dtype)
        except ValueError:
            dt = None  # a type braid does not have: the call names one with dtype=
        what = "braid.DeviceMemory (dtype %s)" % self.dtype
        return _buffers.Buffer(self.ptr if self.nbytes else 0, self.nbytes, dt, "CUDA", (self,), what,
                               self.dtype == "uint8")

    def __repr__(self):
        return "<braid.DeviceMemory %d bytes at 0x%x, shape %s, dtype %s%s>" % (
            self.nbytes, self.ptr, self.shape, self.dtype, ", freed" if self.freed else "")


class Registration(_Held):
    """A buffer registered with a communicator (``Communicator.register``,
    braid_mem_register). ``handle`` is braid's handle (an int; on the
    backends without registration a token), ``addr`` and ``nbytes`` the
    registered bytes. ``deregister()`` (or the end of a ``with`` block) ends
    it with braid_mem_deregister; the buffer stays referenced until then."""

    __slots__ = ("handle", "addr", "nbytes")

    def __init__(self):
        raise TypeError("a Registration comes from Communicator.register")

    @classmethod
    def _make(cls, comm, key, handle, addr, nbytes):
        return cls._held(comm, key, handle=handle, addr=addr, nbytes=nbytes)

    @property
    def registered(self):
        """Whether it is still registered (not deregistered, communicator not destroyed)."""
        return self._live()

    def deregister(self):
        """Ends the registration (braid_mem_deregister). Deregistering twice,
        or after the communicator was destroyed, raises InvalidArgumentError."""
        call = "braid_mem_deregister"
        c = self._comm
        with c._mem_lock:
            c._handle(call)
            if not self.registered:
                raise InvalidArgumentError("%s: the registration of %d bytes at 0x%x (handle 0x%x) was deregistered "
                                           "already%s" % (call, self.nbytes, self.addr, self.handle or 0, c._note()))
            self._finalizer.detach()
            c._release(self._key, call)

    _end = deregister

    def __repr__(self):
        return "<braid.Registration of %d bytes at 0x%x%s>" % (
            self.nbytes, self.addr, "" if self.registered else ", deregistered")


def _shape(shape, call, note):
    shp = (int(shape),) if isinstance(shape, int) or hasattr(shape, "__index__") else tuple(int(s) for s in shape)
    for s in shp:
        if s < 0:
            raise InvalidArgumentError("%s: negative dimension in shape %s%s" % (call, shp, note))
    return shp


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
    shp = _shape(shape, "braid_mem_alloc", _env_rank_note())
    n = 1
    for s in shp:
        n *= s
    nbytes = n * dt.itemsize
    ptr = ctypes.c_void_p()
    st = lib.braid_mem_alloc(ctypes.byref(ptr), max(nbytes, 1))
    if st != 0:
        _raise(lib, None, st, "braid_mem_alloc")
    raw = (ctypes.c_char * max(nbytes, 1)).from_address(ptr.value)
    weakref.finalize(raw, _mem_free_quietly, lib, ptr.value).atexit = False  # as in Communicator.mem_alloc
    arr = numpy.frombuffer(raw, dtype=dt, count=n).reshape(shp)
    return arr


__all__ = ["init", "Communicator", "DeviceMemory", "Registration", "mem_alloc", "library_version", "library_path",
           "SPLIT_NONE", "DType", "Op"]
