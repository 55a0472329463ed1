"""The worker's side of ``launch(working_dir=..., py_modules=[...])``: the job's own code.

The launch ships the local modules and files as one zip archive, named by
the hash of its content, inside the job's payload. Before the training
function is unpickled, :class:`Shipped` unpacks the archive once per host and
hash (``<tmp>/clustersdk-code/<hash>/``), puts it first on ``sys.path``, drops
modules of the same names that an earlier job imported (another version of
them) and, for a ``working_dir``, makes it the current directory; afterwards
it undoes all of that, so the next job on the worker starts clean.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import os
import shutil
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from typing import Any

import cloudpickle

_unpack_lock = threading.Lock()


def cache_dir() -> str:
    """Where unpacked archives are kept on this host."""
    return os.path.join(tempfile.gettempdir(), "clustersdk-code")


class Shipped:
    """The training function with the code it needs, unpickled where that code is."""

    def __init__(
        self,
        payload: bytes,
        archive: bytes,
        digest: str,
        modules: list[str],
        chdir: bool,
        name: str,
    ):
        self.payload, self.archive, self.digest = payload, archive, digest
        self.modules, self.chdir = modules, chdir
        self.__name__ = self.__qualname__ = name

    def __call__(self, ctx: Any, *args: Any, **kwargs: Any) -> Any:
        with activated(self.archive, self.digest, self.modules, self.chdir):
            fn, fn_args, fn_kwargs, objects = cloudpickle.loads(self.payload)
            ctx.objects.update(objects)  # model=, plan=: their classes may be shipped code
            result = fn(ctx, *fn_args, *args, **fn_kwargs, **kwargs)
            # pickled while the shipped modules can be imported: it may hold their objects
            return Pickled(cloudpickle.dumps(result))


class Pickled:
    """A value pickled already; unpickling it gives the value back."""

    def __init__(self, data: bytes):
        self.data = data

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return cloudpickle.loads, (self.data,)


def unpack(archive: bytes, digest: str) -> str:
    """The archive's directory on this host, unpacked on first use (atomically)."""
    root = os.path.join(cache_dir(), digest)
    with _unpack_lock:
        if os.path.isdir(root):
            return root
        os.makedirs(cache_dir(), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{digest}-", dir=cache_dir())
        try:
            with zipfile.ZipFile(io.BytesIO(archive)) as z:
                z.extractall(tmp)
            try:
                os.rename(tmp, root)
            except OSError:  # another process of this host was first: same content
                if not os.path.isdir(root):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return root


@contextlib.contextmanager
def activated(archive: bytes, digest: str, modules: list[str], chdir: bool) -> Iterator[str]:
    """Import the shipped ``modules`` from the archive while the block runs."""
    root = unpack(archive, digest)
    cwd = os.getcwd()
    _forget(modules)  # another job's version, or one installed: the shipped one wins
    sys.path.insert(0, root)
    importlib.invalidate_caches()
    if chdir:
        os.chdir(root)
    try:
        yield root
    finally:
        if chdir:
            with contextlib.suppress(OSError):
                os.chdir(cwd)
        with contextlib.suppress(ValueError):
            sys.path.remove(root)
        _forget(modules)


def _forget(modules: list[str]) -> None:
    tops = set(modules)
    for name in [n for n in sys.modules if n.split(".", 1)[0] in tops]:
        del sys.modules[name]


def missing_modules(names: list[str]) -> list[str]:
    """Which of the top-level module ``names`` this process can't import (``client.run``)."""
    missing = []
    for name in names:
        try:
            found = name in sys.modules or importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing
