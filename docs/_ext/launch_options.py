"""``.. launch-options::``: the table of launch options, from ``clustersdk/options.py``.

One table per group, in the table's order: each option's name, default and one-line doc,
and which kinds of job take it (``launch``, ``launch_script``). The table is the one
source (``tests/test_options.py`` checks the signatures against it), so the docs can't
drift from the code.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive, directives
from docutils.statemachine import StringList
from sphinx.util.nodes import nested_parse_with_titles


def _literal(text: str) -> str:
    return "``" + text.replace("`", "'") + "``"


def _cell(text: str) -> str:
    # an option's doc is plain text: keep RST from reading its * and | as markup
    for markup in "\\*|_":  # _ too: NCCL_* would be a reference
        text = text.replace(markup, "\\" + markup)
    return text.replace("`", "'")


class LaunchOptions(Directive):
    """Render :data:`clustersdk.options.OPTIONS` (one group with ``:group:``)."""

    option_spec = {"group": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        from clustersdk import options

        wanted = self.options.get("group")
        if wanted is not None and wanted not in options.GROUPS:
            raise self.error(
                f"unknown launch option group {wanted!r}: one of {', '.join(options.GROUPS)}"
            )
        lines: list[str] = []
        for group, (what, page) in options.GROUPS.items():
            if wanted is not None and group != wanted:
                continue
            rows = [o for o in options.OPTIONS if o.group == group]
            if wanted is None:
                lines += [f"**{group}**: {what} (:doc:`/{page}`)", ""]
            lines += [
                ".. list-table::",
                "   :header-rows: 1",
                "   :widths: auto",
                "",
                "   * - option",
                "     - default",
                "     - what",
                "     - jobs",
            ]
            for option in rows:
                kinds = " ".join("fn" if k == options.FUNCTION else "script" for k in option.kinds)
                lines += [
                    f"   * - {_literal(option.name)}",
                    f"     - {_shown(option, options)}",
                    f"     - {_cell(option.doc)}",
                    f"     - {kinds}",
                ]
            lines.append("")
        container = nodes.container(classes=["launch-options"])
        nested_parse_with_titles(
            self.state, StringList(lines, source="clustersdk/options.py"), container
        )
        return [container]


def _shown(option: Any, options: Any) -> str:
    if option.default is options.REQUIRED:
        return "required"
    if option.setting is not None:
        return f"setting ``clustersdk.{option.setting}``"
    return _literal(repr(option.default))


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("launch-options", LaunchOptions)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
