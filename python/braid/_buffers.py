"""From a Python object to (address, element count, dtype), without copying.

Two ways in, tried in this order:

- the buffer protocol (numpy arrays, array.array, bytearray, memoryview, ...):
  the element type comes from the buffer's format;
- DLPack (``__dlpack__`` / ``__dlpack_device__``: PyTorch tensors on the CPU
  and on CUDA, and any other array library that exports it): the element type
  comes from the DLPack type code, so bfloat16 and the FP8 types arrive with
  their own meaning.

braid's own DeviceMemory (Communicator.mem_alloc on nccl) is taken first, as
device memory of its shape and dtype.

Nothing is ever copied: a buffer that is not C-contiguous, or read-only where
the call writes, is refused with InvalidArgumentError. The object returned
keeps the exporter alive (and its export open) for as long as it lives.
"""
import ctypes
import sys

from ._errors import InvalidArgumentError
from ._types import DType, as_dtype

_LITTLE = sys.byteorder == "little"

# ------------------------------------------------------------------ buffer protocol


class _Py_buffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
        ("strides", ctypes.POINTER(ctypes.c_ssize_t)),
        ("suboffsets", ctypes.POINTER(ctypes.c_ssize_t)),
        ("internal", ctypes.c_void_p),
    ]


_PyObject_GetBuffer = ctypes.pythonapi.PyObject_GetBuffer
_PyObject_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(_Py_buffer), ctypes.c_int]
_PyObject_GetBuffer.restype = ctypes.c_int
_PyBuffer_Release = ctypes.pythonapi.PyBuffer_Release
_PyBuffer_Release.argtypes = [ctypes.POINTER(_Py_buffer)]
_PyBuffer_Release.restype = None
_PyBUF_SIMPLE = 0

# struct module format characters -> braid type, by item size.
_FMT = {
    "d": {8: DType.F64}, "f": {4: DType.F32}, "e": {2: DType.F16},
    "b": {1: DType.I8}, "B": {1: DType.U8}, "c": {1: DType.U8}, "?": {1: DType.BOOL},
    "h": {2: DType.I16}, "H": {2: DType.U16},
    "i": {4: DType.I32, 8: DType.I64}, "l": {4: DType.I32, 8: DType.I64}, "q": {8: DType.I64},
    "n": {8: DType.I64, 4: DType.I32},
    "I": {4: DType.U32, 8: DType.U64}, "L": {4: DType.U32, 8: DType.U64}, "Q": {8: DType.U64},
    "N": {8: DType.U64, 4: DType.U32},
    "Zf": {8: DType.C64}, "Zd": {16: DType.C128},
}


def _format_dtype(fmt, itemsize):
    """braid type of a buffer format, or None (unknown), or a str (refused, why)."""
    if not fmt:
        return DType.U8 if itemsize == 1 else None
    order = ""
    if fmt[0] in "@=<>!":
        order, fmt = fmt[0], fmt[1:]
    if order in (">", "!") and itemsize > 1 and _LITTLE:
        return "big-endian elements (format %r)" % (order + fmt)
    if order == "<" and not _LITTLE and itemsize > 1:
        return "little-endian elements (format %r) on a big-endian machine" % (order + fmt)
    return _FMT.get(fmt, {}).get(itemsize)


def _address_of(mv):
    """The address of a C-contiguous memoryview's first byte."""
    view = _Py_buffer()
    _PyObject_GetBuffer(mv, ctypes.byref(view), _PyBUF_SIMPLE)
    try:
        return view.buf or 0
    finally:
        _PyBuffer_Release(ctypes.byref(view))


# ------------------------------------------------------------------ DLPack


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_PyCapsule_GetPointer.restype = ctypes.c_void_p
_PyCapsule_IsValid = ctypes.pythonapi.PyCapsule_IsValid
_PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_PyCapsule_IsValid.restype = ctypes.c_int

_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_ROCM, _DL_ROCM_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 10, 11, 13
_DL_DEVICE_NAMES = {_DL_CUDA: "CUDA", _DL_ROCM: "ROCm", _DL_CUDA_MANAGED: "CUDA managed", 4: "OpenCL",
                    7: "Vulkan", 8: "Metal", 9: "VPI", 12: "extension device", 14: "oneAPI", 15: "WebGPU",
                    16: "Hexagon"}

# (DLPack type code, bits) -> braid type
_DL_TYPES = {
    (0, 8): DType.I8, (0, 16): DType.I16, (0, 32): DType.I32, (0, 64): DType.I64,
    (1, 8): DType.U8, (1, 16): DType.U16, (1, 32): DType.U32, (1, 64): DType.U64,
    (2, 16): DType.F16, (2, 32): DType.F32, (2, 64): DType.F64,
    (4, 16): DType.BF16,
    (5, 64): DType.C64, (5, 128): DType.C128,
    (6, 8): DType.BOOL,
    (10, 8): DType.FP8_E4M3,  # kDLFloat8_e4m3fn
    (12, 8): DType.FP8_E5M2,  # kDLFloat8_e5m2
}


class Buffer:
    """A buffer ready for a braid call. ``addr`` is 0 for an empty buffer."""

    __slots__ = ("addr", "nbytes", "dtype", "device", "keep", "what", "raw_bytes")

    def __init__(self, addr, nbytes, dtype, device, keep, what, raw_bytes=False):
        self.raw_bytes = raw_bytes  # plain bytes (format "B"): dtype= may read them as any type
        self.addr = addr
        self.nbytes = nbytes
        self.dtype = dtype  # DType, or None: raw bytes whose type the caller must name
        self.device = device  # None: host memory; else a name ("CUDA")
        self.keep = keep  # objects that pin the memory
        self.what = what  # how to name the element type in messages

    def count(self, dtype):
        return self.nbytes // dtype.itemsize


def _describe(obj):
    t = type(obj)
    return "%s.%s" % (t.__module__, t.__qualname__) if t.__module__ != "builtins" else t.__qualname__


def _is_torch(obj):
    return type(obj).__module__.startswith("torch")


def producer_stream(obj):
    """The CUDA stream (a cudaStream_t value) whose work a device array must
    wait for: torch's or CuPy's current stream, or the stream a
    __cuda_array_interface__ (version 3) names; None where nothing says."""
    if _is_torch(obj):
        torch = sys.modules["torch"]
        if getattr(obj, "is_cuda", False):
            return torch.cuda.current_stream(obj.device).cuda_stream
        return None
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(obj, cupy.ndarray):
        return cupy.cuda.get_current_stream().ptr
    if getattr(type(obj), "_braid_buffer", None):
        return None  # braid's own device memory: no producer stream known
    cai = getattr(obj, "__cuda_array_interface__", None)
    s = cai.get("stream") if isinstance(cai, dict) else None
    # 1 and 2 are CUDA's cudaStreamLegacy and cudaStreamPerThread handles
    return s if isinstance(s, int) and s > 0 else None


def _from_buffer(obj, mv, writable, call, arg, rank_note):
    if not mv.c_contiguous:
        raise InvalidArgumentError(
            "%s: %s is not contiguous (shape %s, strides %s); braid does not copy: pass a contiguous array "
            "(numpy.ascontiguousarray(x), t.contiguous())%s"
            % (call, arg, tuple(mv.shape), tuple(mv.strides), rank_note))
    if writable and mv.readonly:
        raise InvalidArgumentError(
            "%s: %s is read-only but the call writes into it; pass a writable array%s" % (call, arg, rank_note))
    dt = _format_dtype(mv.format, mv.itemsize)
    if isinstance(dt, str):
        raise InvalidArgumentError("%s: %s has %s, which braid does not take%s" % (call, arg, dt, rank_note))
    addr = _address_of(mv) if mv.nbytes else 0
    what = "%s (format %r, %d-byte items)" % (_describe(obj), mv.format, mv.itemsize)
    raw = mv.itemsize == 1 and mv.format in ("B", "c", "@B", "=B", "<B", ">B")
    return Buffer(addr, mv.nbytes, dt, None, (obj, mv), what, raw)


def _dl_contiguous(t):
    if not t.strides:
        return True
    expect = 1
    for i in reversed(range(t.ndim)):
        n = t.shape[i]
        if n != 1 and t.strides[i] != expect:
            return False
        expect *= n
    return True


def _from_dlpack(obj, writable, call, arg, rank_note):
    forced = None
    if getattr(obj, "requires_grad", False) and hasattr(obj, "detach"):
        obj = obj.detach()  # same memory; torch refuses to export a tensor that requires grad
    try:
        dev_type, dev_id = obj.__dlpack_device__()
        cap = obj.__dlpack__()
    except (RuntimeError, TypeError, BufferError, ValueError) as e:
        # torch 1.x exports no bool tensor: export its bytes, keep the type.
        if _is_torch(obj) and str(getattr(obj, "dtype", "")) == "torch.bool":
            torch = sys.modules["torch"]
            obj = obj.view(torch.uint8)
            forced = DType.BOOL
            dev_type, dev_id = obj.__dlpack_device__()
            cap = obj.__dlpack__()
        else:
            raise InvalidArgumentError("%s: %s (%s) cannot be exported through DLPack: %s%s"
                                       % (call, arg, _describe(obj), e, rank_note)) from None
    if not _PyCapsule_IsValid(cap, b"dltensor"):
        raise InvalidArgumentError("%s: %s.__dlpack__() did not return a DLPack capsule%s" % (call, arg, rank_note))
    # The capsule is left unconsumed: its destructor releases the export when
    # the Buffer (which holds it) goes.
    mt = ctypes.cast(_PyCapsule_GetPointer(cap, b"dltensor"), ctypes.POINTER(_DLManagedTensor)).contents
    t = mt.dl_tensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    n = 1
    for s in shape:
        n *= s
    if t.dtype.lanes != 1:
        raise InvalidArgumentError("%s: %s has vector elements (%d lanes)%s" % (call, arg, t.dtype.lanes, rank_note))
    if n and not _dl_contiguous(t):
        strides = tuple(t.strides[i] for i in range(t.ndim))
        raise InvalidArgumentError(
            "%s: %s is not contiguous (shape %s, strides %s elements); braid does not copy: pass a contiguous "
            "tensor (t.contiguous())%s" % (call, arg, shape, strides, rank_note))
    bits = t.dtype.bits
    dt = forced or _DL_TYPES.get((t.dtype.code, bits))
    what = "%s (DLPack type code %d, %d bits)" % (_describe(obj), t.dtype.code, bits)
    if dt is None:
        raise InvalidArgumentError("%s: %s has elements braid does not know: %s%s" % (call, arg, what, rank_note))
    nbytes = n * dt.itemsize
    if dev_type in (_DL_CPU, _DL_CUDA_HOST, _DL_ROCM_HOST):
        device = None
    else:
        device = "%s:%d" % (_DL_DEVICE_NAMES.get(dev_type, "device type %d" % dev_type), dev_id)
    addr = (t.data + t.byte_offset) if (n and t.data) else 0
    return Buffer(addr, nbytes, dt, device, (obj, cap), what)


def _export(obj, writable, call, arg, rank_note):
    """A Buffer for obj through the buffer protocol or DLPack."""
    refused = None
    try:
        mv = memoryview(obj)
    except TypeError:
        mv = None
    except (ValueError, BufferError) as e:  # numpy: "cannot include dtype 'M' in a buffer"
        mv, refused = None, e
    if mv is not None:
        buf = _from_buffer(obj, mv, writable, call, arg, rank_note)
    elif hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        buf = _from_dlpack(obj, writable, call, arg, rank_note)
    elif refused is not None:
        raise InvalidArgumentError("%s: %s (%s) cannot be exported: %s%s"
                                   % (call, arg, _describe(obj), refused, rank_note))
    else:
        raise InvalidArgumentError(
            "%s: %s (%s) has neither the buffer protocol nor DLPack; pass a numpy array, a torch tensor or "
            "another array that exports one of them%s" % (call, arg, _describe(obj), rank_note))
    return buf


def get(obj, writable, call, arg, rank_note="", dtype=None):
    """A Buffer for obj. writable: the call writes into it. dtype: a type
    that overrides the buffer's own (same item size; raw bytes may be read as
    any type whose size divides their length)."""
    if obj is None:
        raise InvalidArgumentError("%s: %s is None%s" % (call, arg, rank_note))
    own = getattr(type(obj), "_braid_buffer", None)  # braid's own device memory (DeviceMemory)
    buf = own(obj, call, arg, rank_note) if own is not None else _export(obj, writable, call, arg, rank_note)
    if dtype is not None:
        try:
            want = as_dtype(dtype)
        except ValueError as e:
            raise InvalidArgumentError("%s: dtype=%s%s" % (call, e, rank_note)) from None
        raw = buf.raw_bytes
        if buf.dtype is not None and not raw and buf.dtype.itemsize != want.itemsize:
            raise InvalidArgumentError(
                "%s: dtype=%s has %d-byte elements but %s holds %s elements of %d bytes%s"
                % (call, want, want.itemsize, arg, buf.dtype, buf.dtype.itemsize, rank_note))
        if buf.nbytes % want.itemsize:
            raise InvalidArgumentError("%s: %s holds %d bytes, not a whole number of %s elements%s"
                                       % (call, arg, buf.nbytes, want, rank_note))
        buf.dtype = want
    elif buf.dtype is None:
        raise InvalidArgumentError(
            "%s: braid cannot tell the element type of %s: %s; name it with dtype= (e.g. dtype=braid.DType.BF16)%s"
            % (call, arg, buf.what, rank_note))
    return buf
