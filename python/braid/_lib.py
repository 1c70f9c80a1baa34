"""Finding and loading libbraid, and the ctypes declarations of include/braid.h.

The library is looked up, first match wins:

1. ``BRAID_LIBRARY``: the path of ``libbraid.so`` (or of a directory holding
   it). When set, nothing else is tried.
2. The library directory ``make install`` recorded in ``_install_config.py``.
3. The prefix the package is installed under: ``PREFIX/lib/python3.X/...``
   and ``PREFIX/lib/python3/dist-packages`` lead to ``PREFIX/lib``,
   ``PREFIX/lib64`` and ``PREFIX/lib/<multiarch>``; in a source checkout
   (``python/braid``) the checkout's ``build/``.
4. ``/usr/local/lib`` (where ``make install`` puts it by default, which the
   dynamic loader's cache may not know until ``ldconfig`` runs), then the
   dynamic loader's own search (``LD_LIBRARY_PATH``, ``ldconfig``).

Calls go through ``ctypes.CDLL``, which releases the GIL for the duration of
every call into the library.
"""
import ctypes
import os
import sys
import sysconfig
import threading

from ._errors import LibraryNotFoundError

SONAME = "libbraid.so.0"
_NAMES = (SONAME, "libbraid.so")

_lock = threading.Lock()
_lib = None
_path = None


class braid_config(ctypes.Structure):
    """struct braid_config of include/braid.h."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("backend", ctypes.c_char_p),
        ("rank", ctypes.c_int),
        ("world_size", ctypes.c_int),
        ("timeout_s", ctypes.c_double),
        ("destroy_timeout_s", ctypes.c_double),
        ("store_addr", ctypes.c_char_p),
        ("token_hex", ctypes.c_char_p),
        ("local_rank", ctypes.c_int),
        ("local_size", ctypes.c_int),
        ("init_timeout_s", ctypes.c_double),
    ]

    def __init__(self):
        # BRAID_CONFIG_INIT
        super().__init__(ctypes.sizeof(braid_config), None, -1, -1, -1.0, -1.0, None, None, -1, -1, -1.0)


_c_comm_p = ctypes.c_void_p
_st = ctypes.c_int  # braid_status
_sz = ctypes.c_size_t
_vp = ctypes.c_void_p
_u32 = ctypes.c_uint32
_u64 = ctypes.c_uint64
_u64p = ctypes.POINTER(ctypes.c_uint64)
_int = ctypes.c_int

# name: (restype, argtypes)
_PROTOTYPES = {
    "braid_version": (ctypes.c_char_p, []),
    "braid_dtype_size": (_sz, [_int]),
    "braid_dtype_name": (ctypes.c_char_p, [_int]),
    "braid_op_name": (ctypes.c_char_p, [_int]),
    "braid_status_string": (ctypes.c_char_p, [_int]),
    "braid_last_error": (ctypes.c_char_p, [_c_comm_p]),
    "braid_init": (_st, [ctypes.POINTER(braid_config), ctypes.POINTER(_c_comm_p)]),
    "braid_destroy": (_st, [_c_comm_p]),
    "braid_abort": (_st, [_c_comm_p]),
    "braid_world_size": (_int, [_c_comm_p]),
    "braid_rank": (_int, [_c_comm_p]),
    "braid_backend": (ctypes.c_char_p, [_c_comm_p]),
    "braid_all_reduce": (_st, [_c_comm_p, _vp, _sz, _int, _int]),
    "braid_broadcast": (_st, [_c_comm_p, _vp, _sz, _int, _int]),
    "braid_all_gather": (_st, [_c_comm_p, _vp, _vp, _sz, _int]),
    "braid_reduce_scatter": (_st, [_c_comm_p, _vp, _vp, _sz, _int, _int]),
    "braid_reduce": (_st, [_c_comm_p, _vp, _vp, _sz, _int, _int, _int]),
    "braid_gather": (_st, [_c_comm_p, _vp, _vp, _sz, _int, _int]),
    "braid_scatter": (_st, [_c_comm_p, _vp, _vp, _sz, _int, _int]),
    "braid_all_to_all": (_st, [_c_comm_p, _vp, _vp, _sz, _int]),
    "braid_send": (_st, [_c_comm_p, _vp, _sz, _int, _int, _u32]),
    "braid_recv": (_st, [_c_comm_p, _vp, _sz, _int, _int, _u32]),
    "braid_sync": (_st, [_c_comm_p]),
    "braid_barrier": (_st, [_c_comm_p]),
    "braid_split": (_st, [_c_comm_p, _u32, _u32, ctypes.POINTER(_c_comm_p)]),
    "braid_mem_alloc": (_st, [ctypes.POINTER(_vp), _sz]),
    "braid_mem_free": (_st, [_vp]),
    "braid_comm_mem_alloc": (_st, [_c_comm_p, ctypes.POINTER(_vp), _sz]),
    "braid_comm_mem_free": (_st, [_c_comm_p, _vp]),
    "braid_mem_register": (_st, [_c_comm_p, _vp, _sz, ctypes.POINTER(_vp)]),
    "braid_mem_deregister": (_st, [_c_comm_p, _vp]),
    "braid_has_stream_sync": (ctypes.c_bool, [_c_comm_p]),
    "braid_event_create": (_st, [_c_comm_p, _u64p]),
    "braid_event_destroy": (_st, [_c_comm_p, _u64]),
    "braid_event_record_on_comm_stream": (_st, [_c_comm_p, _u64]),
    "braid_event_record_on_stream": (_st, [_c_comm_p, _u64, _u64]),
    "braid_comm_stream_wait_event": (_st, [_c_comm_p, _u64]),
    "braid_stream_wait_event": (_st, [_c_comm_p, _u64, _u64]),
    "braid_sync_comm_stream": (_st, [_c_comm_p]),
}


def _multiarch():
    m = sysconfig.get_config_var("MULTIARCH")
    return m if isinstance(m, str) and m else None


def _libdirs_of_prefix(prefix):
    dirs = [os.path.join(prefix, "lib"), os.path.join(prefix, "lib64")]
    ma = _multiarch()
    if ma:
        dirs.append(os.path.join(prefix, "lib", ma))
    return dirs


def candidates():
    """Where the library is looked for, in order: (path, why) pairs."""
    dirs = []
    try:
        from . import _install_config  # written by `make install`

        libdir = getattr(_install_config, "LIBDIR", None)
        if libdir:
            dirs.append((libdir, "the library directory of `make install`"))
    except ImportError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    # Source checkout: python/braid -> the checkout's build/ (make's default BUILD).
    root = os.path.dirname(os.path.dirname(here))
    if os.path.exists(os.path.join(root, "include", "braid.h")):
        dirs.append((os.path.join(root, "build"), "the source checkout's build directory"))
    # Installed package: walk up from site-packages / dist-packages to the prefix.
    d = here
    for _ in range(5):
        d = os.path.dirname(d)
        if not d or d == os.path.dirname(d):
            break
        if os.path.basename(d) in ("lib", "lib64"):
            for ld in _libdirs_of_prefix(os.path.dirname(d)):
                dirs.append((ld, "the prefix the package is installed in"))
            break
    for prefix in (sys.prefix, "/usr/local"):
        for ld in _libdirs_of_prefix(prefix):
            dirs.append((ld, "prefix " + prefix))
    seen, out = set(), []
    for ld, why in dirs:
        for n in _NAMES:
            p = os.path.join(ld, n)
            if p not in seen:
                seen.add(p)
                out.append((p, why))
    return out


# Calls a libbraid older than this package may lack: the library still loads,
# and calling one raises UnsupportedError.
OPTIONAL = frozenset(("braid_reduce", "braid_gather", "braid_scatter", "braid_all_to_all", "braid_comm_mem_alloc",
                      "braid_comm_mem_free", "braid_mem_register", "braid_mem_deregister"))


def _declare(lib):
    for name, (res, args) in _PROTOTYPES.items():
        if name in OPTIONAL and not hasattr(lib, name):
            continue
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    return lib


def _load_explicit(spec):
    path = spec
    if os.path.isdir(spec):
        for n in _NAMES:
            if os.path.exists(os.path.join(spec, n)):
                path = os.path.join(spec, n)
                break
        else:
            raise LibraryNotFoundError(
                "BRAID_LIBRARY=%s is a directory without %s or libbraid.so" % (spec, SONAME))
    try:
        return ctypes.CDLL(path), path
    except OSError as e:
        raise LibraryNotFoundError("BRAID_LIBRARY=%s could not be loaded: %s" % (spec, e)) from None


def load():
    """The loaded library (ctypes.CDLL with prototypes), loading it on first use."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        spec = os.environ.get("BRAID_LIBRARY")
        if spec:
            lib, path = _load_explicit(spec)
        else:
            lib = path = None
            tried = []
            for p, why in candidates():
                if not os.path.exists(p):
                    tried.append("%s (%s): absent" % (p, why))
                    continue
                try:
                    lib, path = ctypes.CDLL(p), p
                    break
                except OSError as e:
                    tried.append("%s (%s): %s" % (p, why, e))
            if lib is None:
                for n in _NAMES:
                    try:
                        lib, path = ctypes.CDLL(n), n
                        break
                    except OSError as e:
                        tried.append("%s (the dynamic loader's search): %s" % (n, e))
            if lib is None:
                raise LibraryNotFoundError(
                    "libbraid was not found; set BRAID_LIBRARY to the path of libbraid.so "
                    "(e.g. build/libbraid.so, or PREFIX/lib/libbraid.so.0 after `make install`). Tried:\n  "
                    + "\n  ".join(tried))
        try:
            _declare(lib)
        except AttributeError as e:
            raise LibraryNotFoundError("%s is not a usable libbraid: %s" % (path, e)) from None
        _path = path
        _lib = lib
        return lib


def path():
    """The path of the loaded library (loading it if needed)."""
    load()
    return _path
