"""What the magics do with cells and remote errors: a cell as a training function, a
job's output streamed into the notebook, a rank's failure shown as its own traceback,
clustersdk's own errors as one line. Pure IPython; :mod:`clustersdk.magics` uses it."""

from __future__ import annotations

import ast
import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

from IPython.core.error import UsageError

import clustersdk as cs

from .widgets import source

CELL_FUNCTION = "cell"  # jobs from %%distributed are called cell-<id> unless --name says


class RemoteFailure(Exception):
    """A rank of a ``%%distributed`` cell raised: shows the remote traceback, not ours."""

    def __init__(self, error: cs.JobFailedError):
        super().__init__(f"rank {error.rank} raised {error.exc_type}: {error.message}")
        self.error = error

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), (self.error,)  # rebuilt from the error (its text is derived)

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of our frames
        e = self.error
        return [
            f"Remote traceback (rank {e.rank} of job {e.job!r}):",
            e.traceback.rstrip(),
            f"job {e.job!r} failed: rank {e.rank} raised {e.exc_type}: {e.message}",
        ]


class RemoteRunFailure(Exception):
    """``%%job run``'s cell raised (or timed out) on some ranks: their remote tracebacks."""

    def __init__(self, error: cs.RunError):
        super().__init__(str(error).splitlines()[0])
        self.error = error

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), (self.error,)  # rebuilt from the error (its text is derived)

    def _render_traceback_(self) -> list[str]:
        return str(self.error).splitlines()


@contextlib.contextmanager
def one_line() -> Iterator[None]:
    """clustersdk's own errors (bad name, wrong state, bad argument) as one-line UsageErrors."""
    try:
        yield
    except (cs.JobFailedError, cs.RunError):
        raise
    except cs.ClusterSDKError as e:
        raise UsageError(str(e)) from None


def cell_function(
    body: str, namespace: dict[str, Any], *, returns_last: bool = False
) -> types.FunctionType:
    """``def cell(ctx): <body>``, with the notebook's namespace as its globals.

    Built from the syntax tree, not by indenting text, so multi-line strings
    keep their content and line numbers match the cell. Its module is
    ``__main__``, so cloudpickle ships it, and the globals it names, by value.
    With ``returns_last``, a last line that is an expression is what it returns
    (as a notebook cell shows its last expression).
    """
    try:
        tree = ast.parse(body, filename="<%%distributed>")
    except SyntaxError as e:
        raise UsageError(f"the cell has a syntax error: {e.msg} (line {e.lineno})") from None
    if returns_last and tree.body and isinstance(tree.body[-1], ast.Expr):
        tree.body[-1] = ast.copy_location(ast.Return(value=tree.body[-1].value), tree.body[-1])
    params = ast.arguments(
        posonlyargs=[], args=[ast.arg(arg="ctx")], kwonlyargs=[], kw_defaults=[], defaults=[]
    )
    extra = {"type_params": []} if sys.version_info >= (3, 12) else {}
    fn = ast.FunctionDef(
        name=CELL_FUNCTION,
        args=params,
        body=tree.body or [ast.Pass()],
        decorator_list=[],
        returns=None,
        **extra,
    )
    module = ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[]))
    try:
        code = compile(module, "<%%distributed>", "exec")
    except SyntaxError as e:
        raise UsageError(f"the cell has a syntax error: {e.msg} (line {e.lineno})") from None
    fn_code = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    return types.FunctionType(fn_code, namespace, CELL_FUNCTION)


def stream(job: cs.Job, poll: float = 0.25) -> Any:
    """Print each rank's output as it comes (``[rank 1] ...``); return rank 0's result.

    Ctrl-C (interrupting the kernel) stops the job.
    """
    seq = 0
    width = len(str(max(job.world_size - 1, 0)))
    try:
        while True:
            done, result, error = _wait_a_little(job, poll)
            for line in source.log_lines(job, since=seq):
                seq = max(seq, line["seq"])
                out = sys.stderr if line["stream"] == "stderr" else sys.stdout
                print(f"[rank {line['rank']:>{width}}] {line['text']}", file=out)
            if done:
                break
    except KeyboardInterrupt:
        job.stop(wait=False)
        raise UsageError(
            f"interrupted: job {job.name!r} is stopping at its next step boundary"
        ) from None
    if isinstance(error, cs.JobFailedError):
        raise RemoteFailure(error) from None
    if error is not None:
        print(f"job {job.name!r}: {error}", file=sys.stderr)
        return None
    return result


def _wait_a_little(job: cs.Job, timeout: float) -> tuple[bool, Any, Exception | None]:
    try:
        return True, job.wait(timeout=timeout), None
    except cs.JobTimeoutError:
        return False, None, None
    except (cs.JobFailedError, cs.JobStoppedError) as e:
        return True, None, e
