"""A script that starts a local cluster must do it under ``if __name__ == "__main__":``.

Dask starts each worker in a new process that imports the script again (the
``spawn`` method); a script that starts a cluster at import would start one
in every worker, and each of those dies with multiprocessing's bootstrapping
``RuntimeError`` (four tracebacks, then ``Nanny failed to start``). This
module says so in one line instead, before anything starts.
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import sys
from types import FrameType

from ..errors import SpecError

MESSAGE = (
    "{what} runs at the top level of {script}, which every worker process imports again "
    'as it starts: put the cluster under  if __name__ == "__main__":'
)
IN_WORKER = (
    "{what} ran while a worker process was importing {script} again: put the cluster "
    'under  if __name__ == "__main__":'
)


def check_main_guard(what: str = "Cluster.local") -> None:
    """Raise :class:`SpecError` if ``what`` runs at the unguarded top level of a script."""
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # we are that worker process, importing the script (as __mp_main__) as its parent did
        again = getattr(sys.modules.get("__mp_main__"), "__file__", None) or script
        raise SpecError(IN_WORKER.format(what=what, script=os.path.basename(again or "__main__")))
    if not script or not script.endswith(".py") or not os.path.isfile(script):
        return  # a notebook, the REPL, python -c: nothing re-imports them
    frame = _top_level_frame(main.__dict__)
    if frame is None:
        return
    try:
        with open(script, encoding="utf-8") as f:
            tree = ast.parse(f.read(), script)
    except (OSError, SyntaxError, ValueError):
        return
    if not _guarded(tree.body, frame.f_lineno):
        raise SpecError(MESSAGE.format(what=what, script=os.path.basename(script)))


def _top_level_frame(main_globals: dict) -> FrameType | None:
    """The frame running the main script's own top-level code, if it is on the stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is main_globals:
            return frame
        frame = frame.f_back
    return None


def _guarded(body: list[ast.stmt], line: int) -> bool:
    """Whether ``line`` lies under an ``if`` that tests ``__name__``."""
    for stmt in body:
        end = getattr(stmt, "end_lineno", stmt.lineno)
        if not stmt.lineno <= line <= end:
            continue
        if isinstance(stmt, ast.If) and _tests_name(stmt.test):
            return True
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list) and inner and _guarded(_statements(inner), line):
                return True
        return False
    return False


def _statements(items: list) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for item in items:
        out.extend(item.body if isinstance(item, ast.ExceptHandler) else [item])
    return out


def _tests_name(test: ast.expr) -> bool:
    return any(isinstance(node, ast.Name) and node.id == "__name__" for node in ast.walk(test))
