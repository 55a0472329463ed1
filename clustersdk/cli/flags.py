"""Command-line flags of the launch options (``%%distributed``, ``%run_distributed``,
``clustersdk submit``): one per option of :mod:`clustersdk.options` a command line can
spell (a number, a string, a flag; not a dict, a list or a Python object), ``None``
when not given so that the launch's default (or setting) applies."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from .. import options

_FLAG_NAMES = {
    "world_size": ("-n", "--world-size"),
    "preemptible": ("--not-preemptible",),
    "module": ("-m", "--module"),
}
_FLAG_HELP = {"world_size": "ranks (default: every slot of the cluster)"}


def _int_or_str(text: str) -> int | str:
    """``--priority``: a class name, or an int."""
    return int(text) if text.lstrip("-").isdigit() else text


_TYPES: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "int | str": _int_or_str,
}


def flag(option: options.Option) -> tuple[tuple[str, ...], dict[str, Any]] | None:
    """The ``add_argument`` arguments of ``option``'s flag, or None (it has none)."""
    kind = option.type.removesuffix(" | None")
    names = _FLAG_NAMES.get(option.name, ("--" + option.name.replace("_", "-"),))
    text = _FLAG_HELP.get(option.name, _flag_help(option)).replace("%", "%%")
    common = {"dest": option.name, "default": None}
    if option.type == "bool | None":
        return names, {**common, "action": argparse.BooleanOptionalAction, "help": text}
    if kind == "bool":
        off = option.launch_default is True  # a flag turns it off
        if off and option.name not in _FLAG_NAMES:
            names = ("--no-" + option.name.replace("_", "-"),)
        return names, {
            **common,
            "action": "store_false" if off else "store_true",
            "help": f"turn {option.name} off: {text}" if off else text,
        }
    if kind in _TYPES:
        return names, {**common, "type": _TYPES[kind], "help": text}
    return None


def _flag_help(option: options.Option) -> str:
    if option.setting is not None:
        return f"{option.doc} (default: the clustersdk.{option.setting} setting)"
    if option.launch_default is None or isinstance(option.launch_default, bool):
        return option.doc
    return f"{option.doc} (default: {option.launch_default})"


def flag_names(kind: str) -> tuple[str, ...]:
    """The options of a job of ``kind`` that have a flag, in the table's order."""
    return tuple(o.name for o in options.OPTIONS if kind in o.kinds and flag(o) is not None)


def add_flags(parser: argparse.ArgumentParser, kind: str, skip: tuple[str, ...] = ()) -> None:
    """Add the flags of a ``kind`` job's options to ``parser``, one group per option group."""
    for group, (what, _) in options.GROUPS.items():
        given = [
            f
            for f in (
                flag(o)
                for o in options.OPTIONS
                if o.group == group and kind in o.kinds and o.name not in skip
            )
            if f is not None
        ]
        if given:
            section = parser.add_argument_group(f"{group} ({what})")
            for names, kwargs in given:
                section.add_argument(*names, **kwargs)
