"""Closing a dashboard: every widget it is made of, and nothing else.

(``Widget.close_all()`` would close every widget of the kernel, and closing a
box leaves its children, their layouts and a figure's marks and scales alive.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def widget_tree(root: Any) -> Iterator[Any]:
    """``root`` and every widget its synced traits reach (children, marks, axes, layouts...)."""
    from ipywidgets import Widget

    seen: set[int] = set()
    stack = [root]
    while stack:
        widget = stack.pop()
        if id(widget) in seen:
            continue
        seen.add(id(widget))
        yield widget
        for name in widget.keys:
            value = getattr(widget, name, None)
            if isinstance(value, dict):
                value = list(value.values())
            for item in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(item, Widget):
                    stack.append(item)


def close_tree(root: Any) -> None:
    """Close ``root`` and everything under it; the frontend's views go away with them."""
    for widget in list(widget_tree(root)):
        widget.close()
