#!/usr/bin/env python3
"""Installs the braid Python package beside the C library (`make install`).

    python/install.py --build BUILD [--prefix PREFIX] [--sitedir DIR]

Copies python/braid into the site-packages directory of PREFIX (default: the
build's CMAKE_INSTALL_PREFIX) and records the library directory,
PREFIX/CMAKE_INSTALL_LIBDIR, in braid/_install_config.py, so `import braid`
loads that prefix's libbraid without LD_LIBRARY_PATH or BRAID_LIBRARY.
Honours DESTDIR like `cmake --install`. No pip, no network.

The directory: --sitedir when given; else the one of PREFIX that this
Python already searches (Debian: /usr/local/lib/python3.X/dist-packages for
/usr/local, /usr/lib/python3/dist-packages for /usr); else
PREFIX/lib/python3.X/site-packages, which then goes on PYTHONPATH.
"""
import argparse
import os
import py_compile
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def cache_var(build, name):
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith(name + ":"):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return None


def site_dir(prefix):
    ver = "python%d.%d" % sys.version_info[:2]
    candidates = [os.path.join(prefix, "lib", ver, "dist-packages"), os.path.join(prefix, "lib", "python3", "dist-packages"),
                  os.path.join(prefix, "lib", ver, "site-packages")]
    on_path = [os.path.realpath(p) for p in sys.path if p]
    for c in candidates:
        if os.path.realpath(c) in on_path:
            return c, True
    return os.path.join(prefix, "lib", ver, "site-packages"), False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="the CMake build directory")
    ap.add_argument("--prefix", help="install prefix (default: the build's CMAKE_INSTALL_PREFIX)")
    ap.add_argument("--sitedir", help="where the braid package goes (default: see above)")
    a = ap.parse_args()
    prefix = a.prefix or cache_var(a.build, "CMAKE_INSTALL_PREFIX") or "/usr/local"
    prefix = os.path.abspath(prefix)
    libdir = cache_var(a.build, "CMAKE_INSTALL_LIBDIR") or "lib"
    if not os.path.isabs(libdir):
        libdir = os.path.join(prefix, libdir)
    if a.sitedir:
        site, searched = os.path.abspath(a.sitedir), os.path.realpath(a.sitedir) in [os.path.realpath(p) for p in sys.path if p]
    else:
        site, searched = site_dir(prefix)
    destdir = os.environ.get("DESTDIR", "")
    target = destdir + os.path.join(site, "braid") if destdir else os.path.join(site, "braid")
    os.makedirs(target, exist_ok=True)
    src = os.path.join(HERE, "braid")
    for name in sorted(os.listdir(src)):
        if name.endswith(".py") or name == "py.typed":
            if name == "_install_config.py":
                continue
            shutil.copy2(os.path.join(src, name), os.path.join(target, name))
    with open(os.path.join(target, "_install_config.py"), "w") as f:
        f.write('"""Written by `make install`: where that install put libbraid."""\nLIBDIR = %r\n' % libdir)
    for name in os.listdir(target):
        if name.endswith(".py"):
            try:
                py_compile.compile(os.path.join(target, name), doraise=True)
            except (py_compile.PyCompileError, OSError):
                pass
    print("-- Installing: %s (Python package braid; libbraid from %s)" % (target, libdir))
    if not searched:
        print("-- %s is not on %s's path: add it with PYTHONPATH=%s" % (site, sys.executable, site))
    return 0


if __name__ == "__main__":
    sys.exit(main())
