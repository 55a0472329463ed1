"""The launch options table writes the typed signatures: ``python -m clustersdk.codegen``.

The generated regions are fresh; an option added to the table alone appears in launch's
and launch_script's keywords, the dict of what was given, JobSpec's and WireSpec's
fields, the REST description of a spec, the CLI's flags and the option docs; and mypy, on a user's script, sees launch's keywords and types.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clustersdk import codegen, options
from clustersdk.cli.flags import flag_names
from clustersdk.options import BOTH, FUNCTION, SCRIPT, Option

ROOT = Path(__file__).resolve().parents[1]


def test_the_generated_code_is_what_the_table_says(capsys):
    assert codegen.stale() == {}
    assert codegen.main(["--check"]) == 0
    assert codegen.main(["--bogus"]) == 2 and "usage" in capsys.readouterr().err


def test_a_stale_region_is_shown_as_a_diff_and_rewritten(tmp_path):
    copy = package_copy(tmp_path)
    spec = copy / "clustersdk" / "spec.py"
    spec.write_text(spec.read_text().replace("    keep: int = 3\n", "    keep: int = 4\n"))
    diffs = codegen.stale(copy)
    assert list(diffs) == ["clustersdk/spec.py"]
    assert "-    keep: int = 4\n+    keep: int = 3\n" in diffs["clustersdk/spec.py"]
    assert codegen.write(copy) == ["clustersdk/spec.py"] and codegen.stale(copy) == {}
    spec.write_text(spec.read_text().replace("# <<< generated\n", "", 1))
    with pytest.raises(
        ValueError, match=r"clustersdk/spec.py: generated regions missing \['jobspec-fields'\]"
    ):
        codegen.stale(copy)


def package_copy(tmp_path: Path) -> Path:
    for name in codegen.REGIONS:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(codegen.ROOT / name, tmp_path / name)
    return tmp_path


def function(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    (found,) = [
        f
        for c in tree.body
        if isinstance(c, ast.ClassDef) and c.name == cls
        for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name == name
    ]
    return found


def keywords(fn: ast.FunctionDef) -> dict[str, tuple[str, object]]:
    defaults = [ast.literal_eval(d) if d is not None else None for d in fn.args.kw_defaults]
    return {
        a.arg: (ast.unparse(a.annotation), d)
        for a, d in zip(fn.args.kwonlyargs, defaults, strict=True)
        if a.annotation is not None
    }


def dataclass_fields(path: Path, cls: str) -> list[str]:
    (found,) = [
        c for c in ast.parse(path.read_text()).body if isinstance(c, ast.ClassDef) and c.name == cls
    ]
    return [f.target.id for f in found.body if isinstance(f, ast.AnnAssign)]


def given(fn: ast.FunctionDef) -> list[str]:
    (assign,) = [
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "given"
    ]
    assert isinstance(assign.value, ast.Dict)
    return [ast.literal_eval(k) for k in assign.value.keys if k is not None]


def test_an_option_added_to_the_table_alone_appears_everywhere(tmp_path, monkeypatch):
    new = Option("warmup_steps", "int", 0, "training", "steps of learning-rate warmup", kinds=BOTH)
    table = (*options.OPTIONS, new)
    monkeypatch.setattr(options, "OPTIONS", table)
    monkeypatch.setattr(options, "OPTIONS_BY_NAME", {o.name: o for o in table})
    monkeypatch.setattr(options, "NAMES", tuple(o.name for o in table))
    copy = package_copy(tmp_path)
    assert sorted(codegen.write(copy)) == sorted(codegen.REGIONS)  # every file has options

    base = ast.parse((copy / "clustersdk" / "cluster" / "base.py").read_text())
    launch = function(base, "Cluster", "launch")
    assert list(keywords(launch)) == list(options.names(FUNCTION))
    assert keywords(launch)["warmup_steps"] == ("int", 0)
    assert given(launch) == list(options.names(FUNCTION))
    script = function(base, "Cluster", "launch_script")
    assert list(keywords(script))[-1] == "warmup_steps" and "warmup_steps" in given(script)
    assert given(script) == list(options.names(SCRIPT))

    for module, cls in (("spec.py", "JobSpec"), ("protocol.py", "WireSpec")):
        fields = dataclass_fields(copy / "clustersdk" / module, cls)
        assert fields[fields.index("grace") + 1] == "warmup_steps", cls
    assert dataclass_fields(copy / "clustersdk" / "protocol.py", "WireSpec")[-1] == "version"

    schemas = yaml.safe_load(
        (copy / "extension" / "jupyter_clustersdk" / "openapi.yaml").read_text()
    )
    spec = schemas["components"]["schemas"]["Spec"]["properties"]
    assert spec["warmup_steps"] == {
        "type": "integer",
        "description": "steps of learning-rate warmup",
    }
    assert list(spec).index("warmup_steps") == list(spec).index("grace") + 1

    assert "warmup_steps" in flag_names(FUNCTION) and "warmup_steps" in flag_names(SCRIPT)
    assert "warmup_steps" in options.describe("training")


USER_SCRIPT = """\
import clustersdk as cs


def train(ctx) -> None:
    pass


cluster = cs.Cluster.local(n_workers=2)
cluster.launch(train, world_size="two")
cluster.launch(train, world_size=2, kep=3)
cluster.launch_script("train.py", world_size=2, grace="soon")
cluster.launch(train, world_size=2, keep=3, strategy="fsdp", precision="bf16")
"""
MYPY_CONFIG = """\
[mypy]
follow_imports = silent
[mypy-torch.*,dask.*,distributed.*,numpy.*,tornado.*,IPython.*,ipywidgets.*,msgpack.*,cloudpickle.*,yaml.*,cryptography.*]
follow_imports = skip
ignore_missing_imports = True
"""


def test_mypy_sees_launchs_keywords_and_their_types_in_a_users_script(tmp_path):
    pytest.importorskip("mypy")
    (tmp_path / "user.py").write_text(USER_SCRIPT)
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG)  # the big libraries' own code skipped
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--cache-dir", "cache"]
        + ["user.py"],
        cwd=tmp_path,
        env={"MYPYPATH": str(ROOT), "PATH": "/usr/bin:/bin"},  # the source, as a wheel has it
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in errors] == ["9", "10", "11"], result.stdout
    assert 'Argument "world_size" to "launch" of "Cluster" has incompatible type "str"' in errors[0]
    assert (
        'Unexpected keyword argument "kep" for "launch" of "Cluster"; did you mean "keep"?'
        in (errors[1])
    )
    assert '"grace" to "launch_script" of "Cluster" has incompatible type "str"' in errors[2]
