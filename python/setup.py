"""The braid Python package: pure Python over ctypes, nothing to compile.

    pip install ./python                      # offline: needs only Debian's python3-setuptools (and python3-wheel)
    make install PREFIX=/usr/local            # installs it with the C library, no pip needed

There is deliberately no pyproject.toml: with one, pip builds in an isolated
environment and downloads setuptools first, which fails offline. Without it,
pip builds with the setuptools already installed.
"""
import os
import re

from setuptools import setup

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "braid", "__init__.py")) as f:
    version = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)

setup(
    name="braid",
    version=version,
    description="Collective communication (all-reduce, broadcast, all-gather, reduce-scatter, send/recv) "
    "for numpy arrays and PyTorch tensors, over libbraid",
    long_description=open(os.path.join(here, "README.md")).read(),
    long_description_content_type="text/markdown",
    license="See the braid repository",
    packages=["braid"],
    package_data={"braid": ["py.typed"]},
    python_requires=">=3.8",
    extras_require={"numpy": ["numpy"], "torch": ["torch"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Operating System :: POSIX :: Linux",
        "Topic :: System :: Distributed Computing",
    ],
)
