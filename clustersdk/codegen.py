"""The code the launch options table writes: ``python -m clustersdk.codegen``.

:data:`clustersdk.options.OPTIONS` is the one definition of every launch option. Python
needs some of it spelled out statically, so that ``help()``, IDEs and mypy see real
typed keywords: ``Cluster.launch``'s and ``Cluster.launch_script``'s keyword-only
parameters and the dict of what was given (no ``locals()``), ``JobSpec``'s and
``WireSpec``'s fields; and the REST API's description of a spec (``Spec`` in the
server extension's ``openapi.yaml``) is the table's too. This module writes those
regions of a checkout from the table; each sits between

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
ROOT = PACKAGE.parent  # a checkout: the server extension's package sits beside this one
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


# WireSpec's fields before (required: id, name, world_size) and after its options
WIRE_FIRST = ("name", "world_size")
#: the REST description of WireSpec's fields that are not launch options (protocol.py)
CONTROL_FIELDS: dict[str, dict[str, object]] = {
    "id": {"type": "string"},
    "fn": {
        "type": "string",
        "description": "The training function's qualified name, or what a script job runs "
        "(train.py, -m pkg.train, a command)",
    },
    "owner": {
        "type": "string",
        "nullable": True,
        "description": "Who launched it: the name on the certificate it was launched with "
        "(on a cluster without TLS: the login name)",
    },
    "attempt": {
        "type": "integer",
        "minimum": 0,
        "description": "Gang starts after the first (restarts, resumes)",
    },
    "asked_world_size": {
        "type": "integer",
        "nullable": True,
        "description": "Running on fewer ranks than asked: the size to grow back to",
    },
    "profile_dir": {"type": "string", "nullable": True},
    "args": {
        "type": "array",
        "nullable": True,
        "items": {"type": "string"},
        "description": "A script job's arguments",
    },
    "skip_steps": {
        "type": "array",
        "nullable": True,
        "items": {"type": "integer"},
        "description": "Steps whose batch is dropped (rollbacks)",
    },
    "parent": {
        "type": "string",
        "nullable": True,
        "description": "The id of the job it was forked from (job.fork)",
    },
    "forked_at": {
        "type": "integer",
        "nullable": True,
        "description": "The step of its parent's checkpoint it was forked from",
    },
    "version": {"type": "integer"},
}
JSON_TYPES = {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}


def wire_options() -> list[Option]:
    return [o for o in options.OPTIONS if o.wire is not None and o.name not in WIRE_FIRST]


def wire_fields() -> list[str]:
    """``WireSpec``'s option fields, each with its default from the table (or setting)."""
    return [f'{o.name}: {o.wire_type or o.type} = spec_field("{o.name}")' for o in wire_options()]


def json_schema(annotation: str) -> dict[str, object]:
    """The JSON schema of a Python annotation of the table (``list[str] | None``...)."""
    base = annotation.removesuffix(" | None")
    if base == "int | str":  # priority: a class's name, an int once admitted
        base = "int"
    out: dict[str, object]
    if base.startswith("list["):
        out = {"type": "array", "items": json_schema(base[5:-1])}
    elif base.startswith("dict[str, "):
        value = base[10:-1]
        out = {
            "type": "object",
            "additionalProperties": (
                {"description": "a number, string or boolean"}
                if value == "Any"
                else json_schema(value)
            ),
        }
    else:
        out = {"type": JSON_TYPES[base]}
    if annotation.endswith(" | None"):
        out["nullable"] = True
    return out


def option_schema(option: Option) -> dict[str, object]:
    out = json_schema(option.wire_type or option.type)
    if option.choices and not out.get("nullable"):
        out["enum"] = list(option.choices)
    return {**out, **option.schema, "description": option.doc}


def spec_properties() -> list[str]:
    """The ``Spec`` schema's properties, in ``WireSpec``'s order, one flow mapping each."""
    by_name = options.OPTIONS_BY_NAME
    described = {
        "id": CONTROL_FIELDS["id"],
        **{name: option_schema(by_name[name]) for name in WIRE_FIRST},
        "fn": CONTROL_FIELDS["fn"],
        "owner": CONTROL_FIELDS["owner"],
        **{o.name: option_schema(o) for o in wire_options()},
        **{k: v for k, v in CONTROL_FIELDS.items() if k not in ("id", "fn", "owner")},
    }
    return [f"{name}: {flow(schema)}" for name, schema in described.items()]


def flow(value: object) -> str:
    """``value`` as YAML flow style (JSON's quoting where a plain scalar would not do)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]*", value):
        return json.dumps(value)
    return str(value)


#: file (in a checkout) -> region name -> what the region holds
REGIONS: dict[str, dict[str, Callable[[], list[str]]]] = {
    "clustersdk/cluster/base.py": {
        "launch-keywords": lambda: keywords(FUNCTION),
        "launch-given": lambda: given(FUNCTION),
        "launch-script-keywords": lambda: keywords(SCRIPT, skip=("script",)),
        "launch-script-given": lambda: given(SCRIPT),
    },
    "clustersdk/spec.py": {"jobspec-fields": fields},
    "clustersdk/protocol.py": {"wirespec-fields": wire_fields},
    "extension/jupyter_clustersdk/openapi.yaml": {"spec-properties": spec_properties},
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


def stale(root: Path = ROOT) -> dict[str, str]:
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


def write(root: Path = ROOT) -> list[str]:
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
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
