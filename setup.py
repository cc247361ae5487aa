"""The native module's build (issue 29), which ``FSTREAM_NATIVE_BUILD=0`` skips (issue 39); the rest is setup.cfg.

``transfer_agent.storage._blake3tree`` (Rust, ``native/``) lets a receiver verify files from their blocks as they
land. It is optional: without cargo, or when its build fails, the package installs without it and the receiver
reads each file back once instead (same digests). A provider-only install (an Airflow worker: ``pip install
fstream``) never receives files, so ``FSTREAM_NATIVE_BUILD=0 pip install .`` skips the Rust build and makes a
pure-Python wheel (``py3-none-any``); a DTN installs ``fstream[agent]`` with cargo on ``PATH``, or a wheel built
once with it (``pip wheel .``) for the DTNs' platform and Python.
"""

import os
import sys

from setuptools import setup


def native() -> list:
    """The Rust extension, or none: ``FSTREAM_NATIVE_BUILD=0``, or no setuptools-rust (pyproject's build requirements
    bring it; a build without isolation, ``pip wheel --no-build-isolation``, may not have it)."""
    if os.environ.get("FSTREAM_NATIVE_BUILD", "1") == "0":
        return []
    try:
        from setuptools_rust import Binding, RustExtension
    except ImportError:
        print("fstream: setuptools-rust is not installed: building without the native module", file=sys.stderr)
        return []
    return [RustExtension(
        "transfer_agent.storage._blake3tree",
        path="native/Cargo.toml",
        binding=Binding.PyO3,
        py_limited_api="auto",  # abi3-py311 in native/Cargo.toml: setup.cfg's python_requires says the same
        optional=True,
        debug=False,  # release build also for editable installs (setuptools-rust builds those in debug mode)
    )]


setup(rust_extensions=native())
