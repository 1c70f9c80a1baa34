"""braid.Error and one subclass per braid_status.

Every exception raised for a failed braid call carries braid's own sentence
(``braid_last_error``), which names the call, the argument and the rank, e.g.
``braid_broadcast: root 7 out of range for world size 4 (rank 2)``. Each
subclass also derives from the built-in exception a Python programmer would
catch for that kind of failure (``TimeoutError``, ``ConnectionError``,
``ValueError``, ...).
"""
import builtins
import enum


class Status(enum.IntEnum):
    """braid_status codes (include/braid.h)."""

    OK = 0
    INVALID_ARG = 1
    UNSUPPORTED = 2
    NO_MEMORY = 3
    TIMEOUT = 4
    PEER_LOST = 5
    ABORTED = 6
    MISMATCH = 7
    BOOTSTRAP = 8
    SYSTEM = 9
    BACKEND = 10
    INTERNAL = 11


class Error(Exception):
    """A braid call failed.

    Attributes: ``status`` (a :class:`Status`), ``message`` (braid's sentence),
    ``fatal`` (True when the communicator is failed from now on: every later
    call on it raises the same error; release it with ``destroy()``).
    """

    status = None
    fatal = False

    def __init__(self, message, status=None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = Status(status)

    def __str__(self):
        return self.message


class InvalidArgumentError(Error, ValueError, TypeError):
    """A bad argument (BRAID_ERR_INVALID_ARG): nothing was done and the
    communicator stays usable. Also raised by the Python layer before any
    call for buffers it refuses: non-contiguous, read-only where the call
    writes, an unknown element type, wrong sizes."""

    status = Status.INVALID_ARG


class UnsupportedError(Error, NotImplementedError):
    """A dtype/op pair without meaning, or a feature the backend lacks
    (BRAID_ERR_UNSUPPORTED)."""

    status = Status.UNSUPPORTED


class NoMemoryError(Error, MemoryError):
    status = Status.NO_MEMORY


class TimeoutError(Error, builtins.TimeoutError):
    """A blocking call waited longer than the timeout (BRAID_ERR_TIMEOUT; fatal)."""

    status = Status.TIMEOUT
    fatal = True


class PeerLostError(Error, ConnectionError):
    """Another rank died, disconnected, failed or aborted (BRAID_ERR_PEER_LOST; fatal)."""

    status = Status.PEER_LOST
    fatal = True


class AbortedError(Error):
    """abort() was called on this communicator (BRAID_ERR_ABORTED; fatal)."""

    status = Status.ABORTED
    fatal = True


class MismatchError(Error):
    """A message's size or type differs from the receive's (not fatal), or the
    ranks made different collective calls (fatal) (BRAID_ERR_MISMATCH)."""

    status = Status.MISMATCH


class BootstrapError(Error, ConnectionError):
    """Ranks could not find each other, or bad launcher settings (BRAID_ERR_BOOTSTRAP)."""

    status = Status.BOOTSTRAP


class SystemCallError(Error, OSError):
    """An operating-system call failed (BRAID_ERR_SYSTEM)."""

    status = Status.SYSTEM


class BackendError(Error):
    """The underlying library (MPI, NCCL, CUDA) reported an error (BRAID_ERR_BACKEND)."""

    status = Status.BACKEND


class InternalError(Error):
    """A bug in braid (BRAID_ERR_INTERNAL; fatal)."""

    status = Status.INTERNAL
    fatal = True


class LibraryNotFoundError(ImportError):
    """libbraid could not be found or loaded; the message lists where it was looked for."""


_BY_STATUS = {
    Status.INVALID_ARG: InvalidArgumentError,
    Status.UNSUPPORTED: UnsupportedError,
    Status.NO_MEMORY: NoMemoryError,
    Status.TIMEOUT: TimeoutError,
    Status.PEER_LOST: PeerLostError,
    Status.ABORTED: AbortedError,
    Status.MISMATCH: MismatchError,
    Status.BOOTSTRAP: BootstrapError,
    Status.SYSTEM: SystemCallError,
    Status.BACKEND: BackendError,
    Status.INTERNAL: InternalError,
}


def error_for(status, message, fatal=None):
    """The exception for a braid_status code and braid's sentence."""
    try:
        st = Status(status)
        cls = _BY_STATUS.get(st, Error)
    except ValueError:  # a status added to the library after this package
        st, cls = None, Error
    e = cls(message, st if st is not None else None)
    if st is None:
        e.status = status
    if fatal is not None:
        e.fatal = fatal
    return e
