"""braid from Python: collective communication for numpy arrays and PyTorch tensors.

    import braid, numpy as np
    with braid.init() as comm:              # rank, size, backend from braidrun (or torchrun, Slurm, mpirun)
        x = np.arange(4, dtype=np.float32) + comm.rank
        comm.all_reduce(x, braid.Op.SUM)    # in place, bitwise-identical on every rank
        comm.sync()

Run with ``braidrun -n 4 python3 script.py``. See docs/PYTHON.md.
"""
from ._comm import (SPLIT_NONE, Communicator, DeviceMemory, Registration, init, library_path, library_version,
                    mem_alloc)
from ._errors import (AbortedError, BackendError, BootstrapError, Error, InternalError, InvalidArgumentError,
                      LibraryNotFoundError, MismatchError, NoMemoryError, PeerLostError, Status, SystemCallError,
                      TimeoutError, UnsupportedError)
from ._types import DType, Op, as_dtype, as_op

__version__ = "0.2.0"

SUM, PROD, MIN, MAX, AVG, BAND, BOR, BXOR = Op.SUM, Op.PROD, Op.MIN, Op.MAX, Op.AVG, Op.BAND, Op.BOR, Op.BXOR

__all__ = [
    "init", "Communicator", "DeviceMemory", "Registration", "mem_alloc", "library_version", "library_path",
    "SPLIT_NONE", "DType", "Op", "as_dtype", "as_op", "SUM", "PROD", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR",
    "Error", "Status", "InvalidArgumentError", "UnsupportedError", "NoMemoryError", "TimeoutError",
    "PeerLostError", "AbortedError", "MismatchError", "BootstrapError", "SystemCallError", "BackendError",
    "InternalError", "LibraryNotFoundError",
]
