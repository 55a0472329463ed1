"""``JobSpec``: everything a launch asks for, validated before anything runs."""

from __future__ import annotations

import dataclasses
import functools
import getpass
import inspect
import os
import re
import reprlib
from collections.abc import Callable
from typing import Any

import cloudpickle

from . import (
    config,  # noqa: F401 - loads the settings as defaults before any dask.config.set
    options,
)
from .errors import SpecError
from .protocol import WireSpec, new_id


@dataclasses.dataclass
class JobSpec:
    """What to run and on how many ranks: one field per launch option (see
    :mod:`clustersdk.options` for each one's type, default and check), checked here.

    A training function ``fn(ctx, *args, **kwargs)``, or a script job: ``fn=None`` and one of
    ``script``, ``module`` or ``command``, with ``args`` its command line's arguments
    (what ``cluster.launch_script`` makes).

    A field whose default is a setting (``timeout``, ``metrics_interval``,
    ``max_restarts``, ``hold_timeout``) may be None: the setting's value then.
    ``cluster.launch(spec)`` runs it; each launch is a new job.

    >>> JobSpec(fn=print, world_size=2).strategy
    'ddp'
    """

    fn: Callable[..., Any] | None  # None for a script job (script=, module= or command=)
    world_size: int
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    # the options, as clustersdk.options.OPTIONS has them
    # >>> generated: jobspec-fields (python -m clustersdk.codegen)
    strategy: str = "ddp"
    name: str | None = None
    timeout: float | None = None
    metrics_interval: float | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    keep: int = 3
    async_checkpoint: bool = True
    resume: str | None = None
    tensorboard_dir: str | None = None
    max_restarts: int | None = None
    mesh: dict[str, int] | None = None
    precision: str = "fp32"
    grad_accum: int = 1
    clip_grad_norm: float | None = None
    microbatches: int | None = None
    schedule: str | None = None
    split: list[str] | None = None
    reshard_after_forward: bool | None = None
    cpu_offload: bool | None = None
    model: Any = None
    plan: dict[str, Any] | None = None
    env: dict[str, str] | None = None
    working_dir: str | None = None
    py_modules: list[Any] | None = None
    queue: str | None = None
    priority: int | str | None = None
    preemptible: bool = True
    time_limit: float | None = None
    min_world_size: int | None = None
    hang_timeout: float | None = None
    on_hang: str = "report"
    on_error: str = "fail"
    hold_timeout: float | None = None
    debug: bool = False
    hparams: dict[str, Any] | None = None
    on_nan: str = "report"
    on_spike: str = "report"
    script: str | None = None
    module: str | None = None
    command: str | None = None
    grace: float | None = None
    # <<< generated
    id: str = dataclasses.field(default_factory=new_id)

    def __post_init__(self) -> None:
        kind = options.kind_of(self.options())
        if kind == options.SCRIPT:
            self._check_script_call()
        elif self.fn is None:
            raise SpecError(
                "a job runs a training function (fn=...) or a script (script=, "
                "module= or command=); got neither"
            )
        elif not callable(self.fn):
            raise SpecError(
                f"fn must be callable, got {self.fn!r} of type {type(self.fn).__name__}"
            )
        if not isinstance(self.args, (tuple, list)):
            raise SpecError(f"args must be a tuple, got {type(self.args).__name__}")
        self.args = tuple(self.args)
        if not isinstance(self.kwargs, dict):
            raise SpecError(f"kwargs must be a dict, got {type(self.kwargs).__name__}")
        if self.fn is not None:
            _check_call(self.fn, self.args, self.kwargs)
        for name, value in options.check(self.options()).items():
            setattr(self, name, value)
        if self.name is None:  # after the checks: a script, module or command is a str
            self.name = self.default_name()
        if self.script is not None:
            self.script = _script_file(self.script, self.working_dir)
        if self.checkpoint_dir is not None:
            self.checkpoint_dir = _checkpoint_root(self.checkpoint_dir)
        if self.model is not None:
            from .layout import Layout

            self._check_model(Layout.resolve(self.strategy, self.mesh, self.world_size))

    @property
    def kind(self) -> str:
        """``"script"`` (it runs a script, a module or a command) or ``"function"``."""
        return options.kind_of(self.options())

    def _check_script_call(self) -> None:
        """A script job: no function, and its arguments are a command line's."""
        if self.fn is not None:
            raise SpecError(
                f"a job runs a training function or a script, not both: got "
                f"fn={getattr(self.fn, '__qualname__', self.fn)!r} and "
                f"{self.entry_point()}"
            )
        if isinstance(self.args, (str, bytes)) or not isinstance(self.args, (tuple, list)):
            raise SpecError(f"args must be a list of the script's arguments, got {self.args!r}")
        bad = [
            a
            for a in self.args
            if isinstance(a, bool) or not isinstance(a, (str, int, float, os.PathLike))
        ]
        if bad:
            raise SpecError(
                f"args are a command line: strings (or numbers, paths), got "
                f"{bad[0]!r} of type {type(bad[0]).__name__}"
            )
        self.args = tuple(os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in self.args)
        if self.kwargs:
            raise SpecError(
                f"a script takes no kwargs (its arguments go in args=), got {self.kwargs!r}"
            )

    def entry_point(self) -> str:
        """What a script job runs, as a command line would say it (``train.py``,
        ``-m pkg.train``, ``my-trainer``); a function job's qualified name."""
        if self.script is not None:
            return os.path.basename(self.script)
        if self.module is not None:
            return f"-m {self.module}"
        if self.command is not None:
            return self.command
        return getattr(self.fn, "__qualname__", repr(self.fn))

    def options(self) -> dict[str, Any]:
        """Every launch option's value, by name (as :func:`clustersdk.options.check` takes them)."""
        return {name: getattr(self, name) for name in options.NAMES}

    def default_name(self) -> str:
        """The name of a job launched without one: the function's, then the id's start.

        >>> JobSpec(fn=print, world_size=1, id="0123456789ab").name
        'print-012345'
        """
        named = (
            os.path.splitext(os.path.basename(self.script))[0]
            if self.script
            else self.module.rsplit(".", 1)[-1]
            if self.module
            else os.path.basename(self.command)
            if self.command
            else getattr(self.fn, "__name__", "job")
        )
        base = re.sub(r"[^A-Za-z0-9_.-]+", "-", named)
        return f"{base.strip('_.-')[:50] or 'job'}-{self.id[:6]}"

    def renewed(self, **changes: Any) -> JobSpec:
        """This spec as a new job: a new id (and a new name, if it had the one derived
        from its id), ``changes`` made, every option checked again.
        ``cluster.launch(spec)`` launches this.

        >>> spec = JobSpec(fn=print, world_size=1, name="a")
        >>> again = spec.renewed()
        >>> again.id != spec.id, again.name
        (True, 'a')
        """
        derived = self.name == self.default_name()
        return dataclasses.replace(
            self, **{"id": new_id(), "name": None if derived else self.name, **changes}
        )

    def _check_model(self, layout: Any) -> None:
        """Build ``model`` on the meta device (no memory, no weights) and check that it
        can take the job's layout: a plan for tp, enough layers for pp, experts for ep."""
        import torch

        from .runtime import strategies

        model = self.model
        if not isinstance(model, torch.nn.Module):
            if not callable(model):
                raise SpecError(
                    f"model must be an nn.Module or a function returning one, got "
                    f"{type(model).__name__}"
                )
            with torch.device("meta"):
                model = model()
            if not isinstance(model, torch.nn.Module):
                raise SpecError(f"model= returned {type(model).__name__}, not an nn.Module")
        strategies.check(layout, model, plan=self.plan, split=self.split)

    def payload(self, dumps: Callable[[Any], bytes] = cloudpickle.dumps) -> bytes:
        """The function, its arguments and the Python objects given to launch (a model
        factory, a TP plan), pickled by ``dumps``; a clear error if they can't be."""
        if self.fn is None:
            raise SpecError(
                f"job {self.name!r} runs {self.entry_point()}: a script job has no "
                "function to pickle"
            )
        objects = {k: v for k, v in (("model", self.model), ("plan", self.plan)) if v is not None}
        try:
            return dumps((self.fn, self.args, self.kwargs, objects))
        except Exception as e:
            what = getattr(self.fn, "__qualname__", repr(self.fn))
            raise SpecError(
                f"the training function {what} or its arguments can't be pickled "
                f"({type(e).__name__}: {e}); it must be picklable to reach the workers — move "
                "open files, locks, sockets or clients out of it and create them inside the function"
            ) from e

    def to_wire(self) -> WireSpec:
        """What the scheduler keeps and the ranks get: every option, no Python objects."""
        script = self.kind == options.SCRIPT
        return WireSpec(
            id=self.id,
            fn=self.entry_point(),
            owner=owner(),
            args=list(self.args) if script else None,
            **options.to_wire(self.options()),
        )


def _script_file(script: str, working_dir: str | None) -> str:
    """The script's absolute path: a relative one is found in ``working_dir`` (which ships
    it), else in the current directory; it must be a file, and inside ``working_dir``."""
    path = os.path.expanduser(script)
    if not os.path.isabs(path):
        path = os.path.join(working_dir or os.getcwd(), path)
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise SpecError(f"script {script!r} is not a file ({path} does not exist)")
    if working_dir and os.path.commonpath([path, working_dir]) != working_dir:
        raise SpecError(
            f"script {script!r} is outside working_dir={working_dir!r}, which is "
            "what the ranks get: put it there, or leave working_dir out (the script "
            "is then shipped alone)"
        )
    return path


def owner() -> str:
    """Who launches: the login name (what the lab panel and ``clustersdk jobs`` show)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container uid with no passwd entry and no $USER
        return f"uid {os.getuid()}"


def _checkpoint_root(value: str) -> str:
    """A local directory, absolute (``file://`` is one too), or an fsspec URL as given
    (``s3://bucket/run``: every worker reaches it with its own credentials)."""
    from .checkpoint_files import is_url

    if value.startswith("file://"):
        value = value[len("file://") :]
    if not is_url(value):
        return os.path.abspath(os.path.expanduser(value))
    url = value.rstrip("/")
    if url.endswith((":", ":/", "::")) or url.endswith("://"):
        raise SpecError(
            f"checkpoint_dir {value!r} names no bucket or path: give one, e.g. 's3://bucket/runs/a'"
        )
    return url


CONTEXT_NAMES = frozenset({"ctx", "context"})


def _check_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a training function that cannot be called as ``fn(ctx, *args, **kwargs)``:
    one with no positional parameter for the context, one whose first parameter has a
    default (``def f(lr=1e-3)`` would silently get the context as ``lr``), one that does
    not take these ``args`` and ``kwargs``. Each message is one line that names the
    function and the form it should have. A callable whose signature Python can't tell
    (a builtin, some extension types) is let through.

    >>> _check_call(lambda ctx, lr=1e-3: None, (), {"lr": 0.1})
    >>> def train(lr=1e-3): ...
    >>> _check_call(train, (), {})
    Traceback (most recent call last):
    ...
    clustersdk.errors.SpecError: the training function train(lr=0.001) must take the job's context as its first argument, but its first parameter 'lr' has a default (0.001): write def train(ctx, lr=0.001)
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    name = _function_name(fn)
    shown = f"{name}{signature}"
    params = list(signature.parameters.values())
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    must = f"the training function {shown} must take the job's context as its first argument"
    if not positional and not varargs:
        rest = [str(p) for p in params if p.name not in CONTEXT_NAMES]
        raise SpecError(
            f"{must}, but it takes no positional argument: write {_form(name, ['ctx', *rest])}"
        )
    first = positional[0] if positional else None
    if (
        first is not None
        and first.default is not inspect.Parameter.empty
        and first.name not in CONTEXT_NAMES
    ):
        raise SpecError(
            f"{must}, but its first parameter {first.name!r} has a default "
            f"({first.default!r}): write {_form(name, ['ctx', *map(str, params)])}"
        )
    try:
        signature.bind(object(), *args, **kwargs)
    except TypeError as e:
        given = [reprlib.repr(a) for a in args] + [
            f"{k}={reprlib.repr(v)}" for k, v in kwargs.items()
        ]
        fix = "give args= and kwargs= that fit it"
        unknown = [k for k in kwargs if k not in signature.parameters]
        if unknown and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            wanted = [str(p) for p in params] + [f"{k}=..." for k in unknown]
            fix = f"leave {', '.join(unknown)} out of kwargs=, or write {_form(name, wanted)}"
        raise SpecError(
            f"the training function {shown} is called as fn(ctx, *args, **kwargs), and "
            f"{name}({', '.join(['ctx', *given])}) does not fit it: {e}; {fix}"
        ) from None


def _function_name(fn: Callable[..., Any]) -> str:
    """How a message names a training function: ``train``, ``Trainer.fit``,
    ``partial(train)``, ``Trainer()`` (an instance with ``__call__``)."""
    if isinstance(fn, functools.partial):
        return f"partial({_function_name(fn.func)})"
    found = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if found is None:
        return f"{type(fn).__qualname__}()"
    return str(found).rsplit("<locals>.", 1)[-1]  # a function defined in a function


def _form(name: str, params: list[str]) -> str:
    """The signature a training function should have: ``def train(ctx, lr=0.001)``."""
    taking = ", ".join(params)
    if name.endswith("<lambda>"):
        return f"lambda {taking}: ..."
    if not name.isidentifier() and "." not in name:  # partial(train), Trainer()
        return f"a callable taking ({taking})"
    return f"def {name.rsplit('.', 1)[-1]}({taking})"
