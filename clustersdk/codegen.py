"""The code the launch options table writes: ``python -m clustersdk.codegen``.

:data:`clustersdk.options.OPTIONS` is the one definition of every launch option. Python
needs some of it spelled out statically, so that ``help()``, IDEs and mypy see real
typed keywords: ``Cluster.launch``'s and ``Cluster.launch_script``'s keyword-only
parameters and the dict of what was given (no ``locals()``), and ``JobSpec``'s fields.
This module writes those regions of the source from the table; each sits between

.. code-block:: python

    # >>> generated: NAME (python -m clustersdk.codegen)
    ...
    # <<< generated

and is rewritten whole: change the table, then run ``python -m clustersdk.codegen``
(``--check`` exits 1 with the diff when a region is stale; the test suite runs it).
The rest is derived from the table when it runs: the CLI's and ``%%distributed``'s
flags (:mod:`clustersdk.cli.flags`), the option docs (:func:`clustersdk.options.describe`).

>>> print(keywords(FUNCTION)[1])
strategy: str = "ddp",
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from . import options
from .options import FUNCTION, SCRIPT, Config, Option

PACKAGE = Path(__file__).resolve().parent
REGION = re.compile(
    r"^(?P<indent>[ \t]*)# >>> generated: (?P<name>[\w-]+) \(python -m clustersdk\.codegen\)\n"
    r"(?P<body>.*?)"
    r"^(?P=indent)# <<< generated\n",
    re.M | re.S,
)


def annotation(option: Option) -> str:
    """Its type in a signature: ``| None`` added where None means the setting (or, for
    ``world_size``, that ``launch(spec)`` needs none)."""
    if isinstance(option.default, Config) and not option.type.endswith("| None"):
        return f"{option.type} | None"
    return option.type


def _options(kind: str, skip: Sequence[str] = ()) -> list[Option]:
    return [o for o in options.OPTIONS if kind in o.kinds and o.name not in skip]


def literal(value: object) -> str:
    """``value`` as source, quoted as ruff formats it."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def keywords(kind: str, skip: Sequence[str] = ()) -> list[str]:
    """One keyword parameter per option a job of ``kind`` takes, in the table's order."""
    return [
        f"{o.name}: {annotation(o)} = {literal(o.launch_default)}," for o in _options(kind, skip)
    ]


def given(kind: str, skip: Sequence[str] = ()) -> list[str]:
    """The dict of every such keyword, as given (the function's own names)."""
    return ["given = {", *(f'    "{o.name}": {o.name},' for o in _options(kind, skip)), "}"]


def fields() -> list[str]:
    """``JobSpec``'s option fields (``world_size``, required, comes before them)."""
    return [
        f"{o.name}: {annotation(o)} = {literal(o.launch_default)}"
        for o in options.OPTIONS
        if o.default is not options.REQUIRED
    ]


#: file (under the package) -> region name -> what the region holds
REGIONS: dict[str, dict[str, Callable[[], list[str]]]] = {
    "cluster/base.py": {
        "launch-keywords": lambda: keywords(FUNCTION),
        "launch-given": lambda: given(FUNCTION),
        "launch-script-keywords": lambda: keywords(SCRIPT, skip=("script",)),
        "launch-script-given": lambda: given(SCRIPT),
    },
    "spec.py": {"jobspec-fields": fields},
}


def render(text: str, regions: dict[str, Callable[[], list[str]]], where: str = "") -> str:
    """``text`` with each region rewritten; every region named must be there once."""
    found: list[str] = []

    def fill(match: re.Match[str]) -> str:
        name, indent = match["name"], match["indent"]
        if name not in regions:
            raise ValueError(f"{where}: unknown generated region {name!r}")
        found.append(name)
        body = "".join(f"{indent}{line}\n" for line in regions[name]())
        begin = f"{indent}# >>> generated: {name} (python -m clustersdk.codegen)\n"
        return f"{begin}{body}{indent}# <<< generated\n"

    out = REGION.sub(fill, text)
    missing = sorted(set(regions) - set(found))
    twice = sorted({n for n in found if found.count(n) > 1})
    if missing or twice:
        raise ValueError(f"{where}: generated regions missing {missing}, repeated {twice}")
    return out


def stale(root: Path = PACKAGE) -> dict[str, str]:
    """Each file whose generated regions differ from the table: its unified diff."""
    diffs = {}
    for name, regions in REGIONS.items():
        path = root / name
        old = path.read_text()
        new = render(old, regions, name)
        if new != old:
            diffs[name] = "".join(
                difflib.unified_diff(
                    old.splitlines(True), new.splitlines(True), f"a/{name}", f"b/{name}"
                )
            )
    return diffs


def write(root: Path = PACKAGE) -> list[str]:
    """Rewrite the stale files; return their names."""
    written = []
    for name, regions in REGIONS.items():
        path = root / name
        old = path.read_text()
        new = render(old, regions, name)
        if new != old:
            path.write_text(new)
            written.append(name)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in ([], ["--check"]):
        print("usage: python -m clustersdk.codegen [--check]", file=sys.stderr)
        return 2
    if args == ["--check"]:
        diffs = stale()
        for diff in diffs.values():
            sys.stdout.write(diff)
        if diffs:
            print(
                f"stale generated code in {', '.join(diffs)}: run python -m clustersdk.codegen",
                file=sys.stderr,
            )
        return 1 if diffs else 0
    for name in write():
        print(f"wrote {PACKAGE.name}/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
