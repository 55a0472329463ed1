"""Lists the docs show that the code already holds, rendered from it so they cannot drift.

- ``.. job-states::``: a job's states, what each means and what it can become, from
  ``clustersdk.status`` (the enum, its members' comments and ``TRANSITIONS``);
- ``.. magics::``: every IPython magic of ``clustersdk.magics``, with its first line of
  help and, for ``%job``, its actions;
- ``.. exceptions::``: ``autoexception`` of every error class ``clustersdk`` exports, in
  the order ``clustersdk.errors`` defines them (the tree in its docstring).

Each is a plain table or autodoc content: no Graphviz binary, no JavaScript.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList
from sphinx.util.nodes import nested_parse_with_titles


def _rst(text: str) -> str:
    """One line of help as reStructuredText: %magics and ``code`` survive."""
    return " ".join(text.split()).replace("|", "\\|").replace("*", "\\*")


def _parse(directive: Directive, lines: list[str], source: str) -> list[nodes.Node]:
    container = nodes.container()
    nested_parse_with_titles(directive.state, StringList(lines, source=source), container)
    return container.children


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], widths: str) -> list[str]:
    lines = [".. list-table::", "   :header-rows: 1", f"   :widths: {widths}", ""]
    for row in (header, *rows):
        lines.append(f"   * - {row[0]}")
        lines += [f"     - {cell}" for cell in row[1:]]
    return lines + [""]


class JobStates(Directive):
    """The job lifecycle as a table: state, meaning, the states it can become."""

    def run(self) -> list[nodes.Node]:
        from clustersdk import status

        source = inspect.getsource(status.JobStatus)
        meaning = dict(re.findall(r"^\s+([A-Z]+) = \"\w+\"\s+# (.+)$", source, re.M))
        rows = []
        for state in status.JobStatus:
            after = sorted(status.TRANSITIONS[state], key=list(status.JobStatus).index)
            can = ", ".join(f"``{s.name}``" for s in after) or "nothing: it is terminal"
            rows.append((f"``{state.name}``", _rst(meaning.get(state.name, "")), can))
        lines = _table(("state", "what it means", "can become"), rows, "15 45 40")
        return _parse(self, lines, status.__file__)


class Magics(Directive):
    """Every magic ``%load_ext clustersdk`` registers, with its help's first paragraph."""

    def run(self) -> list[nodes.Node]:
        from clustersdk.magics import ClusterMagics

        names: dict[str, list[str]] = {}
        for kind, prefix in (("line", "%"), ("cell", "%%")):
            for name, method in ClusterMagics.magics[kind].items():
                names.setdefault(method, []).append(f"``{prefix}{name}``")
        rows = []
        for method, shown in names.items():
            parser = getattr(ClusterMagics, method).parser
            what = inspect.cleandoc(parser.description or "").split("\n\n")[0]
            actions = [a for a in parser._actions if a.dest == "action"]
            if actions:
                what += f" Actions: {actions[0].help}."
            rows.append((", ".join(shown), _rst(what)))
        lines = _table(("magic", "what it does (``--help`` for its flags)"), rows, "25 75")
        return _parse(self, lines, inspect.getsourcefile(ClusterMagics) or "magics")


class Exceptions(Directive):
    """``autoexception`` for each exception class clustersdk exports, tree order."""

    def run(self) -> list[nodes.Node]:
        import clustersdk
        from clustersdk import errors

        exported = {name for name in clustersdk.__all__}
        classes = [
            name
            for name, value in vars(errors).items()
            if inspect.isclass(value)
            and issubclass(value, errors.ClusterSDKError)
            and name in exported
        ]
        lines = [".. currentmodule:: clustersdk", ""]
        for name in classes:
            lines += [f".. autoexception:: {name}", ""]
        return _parse(self, lines, errors.__file__)


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("job-states", JobStates)
    app.add_directive("magics", Magics)
    app.add_directive("exceptions", Exceptions)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
