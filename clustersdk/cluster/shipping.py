"""``launch(working_dir=..., py_modules=[...])``: the job's own code goes with it.

Functions and classes defined in ``__main__`` (a script, a notebook) travel
by value, as cloudpickle does anyway. Everything else the payload refers to
travels by name, and a worker must be able to import it: the launch looks
at what the pickled function, its arguments and the imports in its body
name, and asks the workers once (results are remembered per scheduler)
whether they can import those modules. One that they can't is an error at
``launch``, naming it and the fix, instead of a ``ModuleNotFoundError`` at
rank start.

The fix is to ship it: ``working_dir`` (a directory: its modules and files,
which becomes the ranks' current directory) and ``py_modules`` (modules or
their names: a package goes whole) are packed into one zip archive named by
the hash of its content and carried in the job's payload; the worker side
is :mod:`clustersdk.runtime.shipping`.
"""

from __future__ import annotations

import dis
import hashlib
import importlib.util
import io
import os
import stat
import sys
import types
import zipfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import cloudpickle

from .. import config
from ..errors import SpecError

if TYPE_CHECKING:
    from distributed import Client

    from ..spec import JobSpec

SKIP_DIRS = frozenset({"__pycache__", "node_modules", "venv", "env", "site-packages"})
SKIP_SUFFIXES = (".pyc", ".pyo")
ALWAYS_THERE = frozenset({"__main__", "__mp_main__", "builtins", "clustersdk", "cloudpickle"})
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # no timestamps: the same files make the same archive
_known: dict[str, set[str]] = {}  # scheduler address -> modules its workers import
_packed: dict[tuple, Package] = {}


@dataclass(frozen=True)
class Package:
    """The shipped code: a zip archive, its hash and the top-level modules in it."""

    archive: bytes
    digest: str
    modules: tuple[str, ...]
    chdir: bool


def payload(spec: JobSpec, client: Client) -> bytes:
    """The job's payload, its code attached; refuses a module the workers can't import."""
    needed: set[str] = set()
    inner = spec.payload(dumps=lambda obj: _dumps_recording(obj, needed))
    package = pack(spec.working_dir, spec.py_modules)
    shipped = set(package.modules) if package else set()
    check_importable(client, needed - shipped, getattr(spec.fn, "__qualname__", "the function"))
    if package is None:
        return inner
    from ..runtime.shipping import Shipped

    runner = Shipped(
        inner,
        package.archive,
        package.digest,
        list(package.modules),
        package.chdir,
        getattr(spec.fn, "__name__", "job"),
    )
    return cloudpickle.dumps((runner, (), {}, {}))


SCRIPT_DIR = "__script__"  # where a script shipped without its working_dir lies in the archive


def script_payload(spec: JobSpec, client: Client | None = None) -> bytes:
    """A script job's payload: its code (``working_dir``, ``py_modules`` and, without a
    ``working_dir``, the script file alone) and the script's place in it. With a
    ``client``, refuses a ``module=`` the workers can't import and nothing ships."""
    from ..runtime.scripts import script_payload as payload_of

    extra, inside = {}, None
    if spec.script is not None:
        if spec.working_dir:
            inside = os.path.relpath(spec.script, spec.working_dir).replace(os.sep, "/")
        else:
            inside = f"{SCRIPT_DIR}/{os.path.basename(spec.script)}"
            extra[inside] = spec.script
    package = pack(spec.working_dir, spec.py_modules, extra)
    if spec.module is not None and client is not None:
        shipped = set(package.modules) if package else set()
        check_importable(client, {spec.module.split(".", 1)[0]} - shipped, f"-m {spec.module}")
    if package is None:
        return payload_of(None, None, inside)
    return payload_of(package.archive, package.digest, inside, package.modules, package.chdir)


# --- what the payload needs ---------------------------------------------------------------
class _Recorder(cloudpickle.Pickler):
    """cloudpickle, noting the modules of what it pickles by reference."""

    def __init__(self, file: Any, needed: set[str]):
        super().__init__(file)
        self.needed = needed

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.ModuleType):
            self._note(obj.__name__)
        elif isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
            if _by_reference(obj):
                self._note(getattr(obj, "__module__", None))
            elif isinstance(obj, types.FunctionType):  # by value: what its body imports
                self.needed.update(_imports(obj.__code__))
        return super().reducer_override(obj)

    def _note(self, module: str | None) -> None:
        if module:
            self.needed.add(module.split(".", 1)[0])


def _by_reference(obj: Any) -> bool:
    check = getattr(cloudpickle.cloudpickle, "_should_pickle_by_reference", None)
    try:
        return True if check is None else bool(check(obj))
    except Exception:  # noqa: BLE001 - an object cloudpickle itself will judge
        return False


def _dumps_recording(obj: Any, needed: set[str]) -> bytes:
    buffer = io.BytesIO()
    _Recorder(buffer, needed).dump(obj)
    return buffer.getvalue()


def _imports(code: types.CodeType) -> set[str]:
    """Top-level modules that ``code`` (and the code nested in it) imports absolutely."""
    found: set[str] = set()
    last_level = 0
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_CONST", "LOAD_SMALL_INT") and isinstance(ins.argval, int):
            last_level = ins.argval
        elif ins.opname == "IMPORT_NAME" and last_level == 0:
            found.add(str(ins.argval).split(".", 1)[0])
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _imports(const)
    return found


def check_importable(client: Client, names: set[str], what: str) -> None:
    """Ask the workers (once per scheduler and name) whether they can import ``names``."""
    address = client.scheduler.address
    known = _known.setdefault(address, set())
    ask = sorted(
        n for n in names - known - ALWAYS_THERE - set(sys.stdlib_module_names) if n.isidentifier()
    )
    if not ask:
        return
    from ..runtime.shipping import missing_modules

    # a worker that can't answer (it is dying, say) is left out: it can't run the job either
    answers = client.run(missing_modules, ask, on_error="ignore")
    for worker, missing in sorted(answers.items()):
        if missing:
            name = missing[0]
            raise SpecError(
                f"module {name!r}, which {what} needs, can't be imported on worker {worker}"
                f"{_where(name)}: ship it with cluster.launch(..., working_dir=<the directory "
                f"that holds it>) or py_modules=[{name}], or install it on the workers"
            )
    if answers:  # no workers yet: nothing learned
        known.update(ask)


def _where(name: str) -> str:
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return ""
    origin = getattr(found, "origin", None) if found else None
    return f" (here it is {origin})" if origin and origin != "built-in" else ""


# --- packing --------------------------------------------------------------------------------
def pack(
    working_dir: str | None, py_modules: list[Any] | None, extra: dict[str, str] | None = None
) -> Package | None:
    """The archive of ``working_dir``, ``py_modules`` and ``extra`` files (name in the
    archive -> local path); None when there is nothing to ship."""
    if not working_dir and not py_modules and not extra:
        return None
    files: dict[str, str] = dict(extra or {})  # name in the archive -> local path
    modules: set[str] = set()
    if working_dir:
        root = os.path.abspath(working_dir)
        for rel, path in _walk(root, limit=int(config.get("code-limit-mb", 64)) << 20):
            files[rel] = path
        modules |= _top_level_modules(root)
    for module in py_modules or ():
        name, path = _locate(module)
        if name in modules:
            raise SpecError(f"py_modules names {name!r}, which working_dir ships already")
        modules.add(name)
        if os.path.isdir(path):
            files.update({f"{name}/{rel}": p for rel, p in _walk(path)})
        else:
            files[f"{name}.py"] = path
    key = tuple(sorted((rel, _stat(path)) for rel, path in files.items())) + (bool(working_dir),)
    if key not in _packed:
        _check_size(files, working_dir)
        archive = _zip(files)
        digest = hashlib.sha256(archive).hexdigest()[:20]
        _packed.clear()  # one entry: the last launch's (a notebook relaunches the same code)
        _packed[key] = Package(archive, digest, tuple(sorted(modules)), bool(working_dir))
    return _packed[key]


def _walk(root: str, limit: int | None = None) -> list[tuple[str, str]]:
    """Every file to ship under ``root``; past ``limit`` bytes a SpecError at once (a
    working_dir of "/" must not be walked whole before it is refused)."""
    out = []
    total = 0
    for here, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(names):
            if name.endswith(SKIP_SUFFIXES) or name.startswith("."):
                continue
            path = os.path.join(here, name)
            if os.path.isfile(path):
                out.append((os.path.relpath(path, root).replace(os.sep, "/"), path))
                if limit is not None:
                    total += os.path.getsize(path)
                    if total > limit:
                        raise SpecError(
                            f"the code to ship (working_dir {root}) holds more than "
                            f"clustersdk.code-limit-mb={limit >> 20} MiB (passed at {path}); "
                            "ship a smaller directory, and put data where every worker can "
                            "read it"
                        )
    return out


def _top_level_modules(root: str) -> set[str]:
    """What ``import x`` finds in ``root``: modules and packages (namespace ones too)."""
    found = set()
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.endswith(".py") and os.path.isfile(path):
            found.add(name[:-3])
        elif (
            os.path.isdir(path)
            and name.isidentifier()
            and name not in SKIP_DIRS
            and any(n.endswith(".py") for n in os.listdir(path))
        ):
            found.add(name)
    return found


def _locate(module: Any) -> tuple[str, str]:
    """(top-level name, file or package directory) of a module object or name."""
    name = module.__name__ if isinstance(module, types.ModuleType) else module
    if not isinstance(name, str) or not name:
        raise SpecError(f"py_modules takes modules or their names, got {module!r}")
    top = name.split(".", 1)[0]
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise SpecError(f"py_modules names {name!r}, which can't be found here to be shipped")
    if found.submodule_search_locations:
        return top, list(found.submodule_search_locations)[0]
    if not found.origin or not found.origin.endswith(".py"):
        raise SpecError(
            f"py_modules names {name!r}, which has no Python source to ship "
            f"({found.origin}); install it on the workers instead"
        )
    return top, found.origin


def _stat(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def _check_size(files: dict[str, str], working_dir: str | None) -> None:
    limit = int(config.get("code-limit-mb", 64)) << 20
    sizes = sorted(((os.path.getsize(p), rel) for rel, p in files.items()), reverse=True)
    total = sum(size for size, _ in sizes)
    if total > limit:
        biggest = ", ".join(f"{rel} ({size >> 20} MiB)" for size, rel in sizes[:3])
        raise SpecError(
            f"the code to ship ({working_dir or 'py_modules'}) holds {total >> 20} MiB, more than "
            f"clustersdk.code-limit-mb={limit >> 20}; the largest files: {biggest}. Put data "
            "where every worker can read it instead"
        )


def _zip(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for rel in sorted(files):
            info = zipfile.ZipInfo(rel, date_time=_ZIP_TIME)
            mode = os.stat(files[rel]).st_mode
            info.external_attr = (0o755 if mode & stat.S_IXUSR else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(files[rel], "rb") as f:
                z.writestr(info, f.read())
    return buffer.getvalue()
