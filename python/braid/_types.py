"""Element types and reduction operations, with the codes of include/braid.h."""
import enum


class DType(enum.IntEnum):
    """braid_dtype. The codes are the reference DType's (numr)."""

    F64 = 0
    F32 = 1
    F16 = 2
    BF16 = 3
    FP8_E4M3 = 4
    FP8_E5M2 = 5
    I64 = 10
    I32 = 11
    I16 = 12
    I8 = 13
    U64 = 20
    U32 = 21
    U16 = 22
    U8 = 23
    BOOL = 30
    C64 = 40
    C128 = 41

    @property
    def itemsize(self):
        return _SIZES[self]

    def __str__(self):
        return _SHORT[self]


_SIZES = {
    DType.F64: 8, DType.F32: 4, DType.F16: 2, DType.BF16: 2, DType.FP8_E4M3: 1, DType.FP8_E5M2: 1,
    DType.I64: 8, DType.I32: 4, DType.I16: 2, DType.I8: 1,
    DType.U64: 8, DType.U32: 4, DType.U16: 2, DType.U8: 1,
    DType.BOOL: 1, DType.C64: 8, DType.C128: 16,
}

# braid_dtype_name's spelling.
_SHORT = {
    DType.F64: "f64", DType.F32: "f32", DType.F16: "f16", DType.BF16: "bf16",
    DType.FP8_E4M3: "fp8_e4m3", DType.FP8_E5M2: "fp8_e5m2",
    DType.I64: "i64", DType.I32: "i32", DType.I16: "i16", DType.I8: "i8",
    DType.U64: "u64", DType.U32: "u32", DType.U16: "u16", DType.U8: "u8",
    DType.BOOL: "bool", DType.C64: "c64", DType.C128: "c128",
}

# Names accepted for dtype= (numpy's and torch's names included).
_NAMES = {}
for _d, _s in _SHORT.items():
    _NAMES[_s] = _d
    _NAMES[_d.name.lower()] = _d
_NAMES.update({
    "float64": DType.F64, "double": DType.F64, "float32": DType.F32,
    "float16": DType.F16, "half": DType.F16, "bfloat16": DType.BF16,
    "float8_e4m3fn": DType.FP8_E4M3, "e4m3": DType.FP8_E4M3, "fp8e4m3": DType.FP8_E4M3,
    "float8_e5m2": DType.FP8_E5M2, "e5m2": DType.FP8_E5M2, "fp8e5m2": DType.FP8_E5M2,
    "int64": DType.I64, "long": DType.I64, "int32": DType.I32,
    "int16": DType.I16, "short": DType.I16, "int8": DType.I8,
    "uint64": DType.U64, "uint32": DType.U32, "uint16": DType.U16, "uint8": DType.U8,
    "bool_": DType.BOOL, "complex64": DType.C64, "cfloat": DType.C64,
    "complex128": DType.C128, "cdouble": DType.C128,
})


class Op(enum.IntEnum):
    """braid_op."""

    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3
    AVG = 4
    BAND = 5
    BOR = 6
    BXOR = 7

    def __str__(self):
        return self.name.lower()


def as_dtype(x):
    """A DType from a DType, its code, a name ("f32", "bfloat16", ...), a numpy
    dtype or scalar type, or a torch dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, int) and not isinstance(x, bool):
        try:
            return DType(x)
        except ValueError:
            raise ValueError("unknown braid dtype code %d" % x) from None
    name = None
    if isinstance(x, str):
        name = x
    else:
        s = str(x)
        if s.startswith("torch."):  # torch.float32, torch.bfloat16
            name = s[len("torch."):]
        else:
            n = getattr(x, "name", None)  # numpy.dtype
            if isinstance(n, str):
                name = n
            else:
                try:  # numpy scalar types: numpy.float32
                    import numpy

                    name = numpy.dtype(x).name
                except Exception:
                    name = None
    if name is not None:
        d = _NAMES.get(name.lower())
        if d is not None:
            return d
    raise ValueError("%r is not an element type braid has (f64, f32, f16, bf16, fp8_e4m3, fp8_e5m2, "
                     "i64..i8, u64..u8, bool, c64, c128)" % (x,))


_OP_NAMES = {o.name.lower(): o for o in Op}
_OP_NAMES.update({"mean": Op.AVG, "average": Op.AVG, "product": Op.PROD, "and": Op.BAND, "or": Op.BOR,
                  "xor": Op.BXOR})


def as_op(x):
    """An Op from an Op, its code or a name ("sum", "avg", ...; torch.distributed.ReduceOp works too)."""
    if isinstance(x, Op):
        return x
    if isinstance(x, int) and not isinstance(x, bool):
        try:
            return Op(x)
        except ValueError:
            raise ValueError("unknown braid op code %d" % x) from None
    if not isinstance(x, str) and type(x).__module__.startswith("torch"):
        # torch.distributed.ReduceOp.SUM (torch 1.13: a ReduceOp instance without a readable str)
        cls = type(x)
        for name in ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"):
            try:
                if x == getattr(cls, name):
                    x = name
                    break
            except Exception:
                continue
    s = x if isinstance(x, str) else str(x)
    s = s.rsplit(".", 1)[-1].lower()  # "ReduceOp.SUM"
    o = _OP_NAMES.get(s)
    if o is None:
        raise ValueError("%r is not a reduction braid has (sum, prod, min, max, avg, band, bor, bxor)" % (x,))
    return o
