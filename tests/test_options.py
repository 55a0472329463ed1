"""One definition per launch option: every entry point agrees with clustersdk.options.

JobSpec's fields, launch's keywords, WireSpec's fields, %%distributed's flags, the REST
description of a job's spec and launch's docstring are each checked against the table;
a setting (clustersdk.yaml, dask.config, DASK_CLUSTERSDK__...) changes every one of them.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dask.config
import pytest
import yaml
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic_arguments import parse_argstring

import clustersdk as cs
from clustersdk import hparams, options
from clustersdk.cli.flags import flag, flag_names
from clustersdk.errors import ProtocolError, SpecError
from clustersdk.magics import FLAGS, ClusterMagics
from clustersdk.options import OPTIONS, OPTIONS_BY_NAME, Option
from clustersdk.protocol import WireSpec
from clustersdk.spec import JobSpec

from . import workloads

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"timeout": 7, "metrics_interval": 0.5, "max_restarts": 2, "hold_timeout": 90}
CHANGED = {f"clustersdk.{options.OPTIONS_BY_NAME[k].setting}": v for k, v in SETTINGS.items()}

# WireSpec fields that are not launch options: the control plane's and the launcher's
WIRE_ONLY = {
    "id",
    "fn",
    "owner",
    "attempt",
    "asked_world_size",
    "profile_dir",
    "skip_steps",
    "parent",
    "forked_at",
    "args",
    "version",
}
# launch options that do not cross the wire: Python objects, pickled into the payload
NOT_ON_THE_WIRE = {"model", "plan"}
# where an option's wire form has another type than what launch takes
WIRE_TYPES = {
    "py_modules": "list[str] | None",  # module objects travel as their names
    "name": "str",
}  # derived from the function when not given


def signature_type(option: Option) -> str:
    """The annotation JobSpec and launch give ``option``: None means "the setting"."""
    return f"{option.type} | None" if option.setting is not None else option.type


def train(ctx=None):
    return None


# the table itself --------------------------------------------------------------------------
def test_every_option_is_documented_grouped_and_checked_once():
    assert len(set(options.NAMES)) == len(OPTIONS) and len(OPTIONS) >= 39
    for option in OPTIONS:
        assert option.group in options.GROUPS, option.name
        assert option.doc and "\n" not in option.doc, option.name
        if option.choices:
            assert option.check(option.choices[0]) == option.choices[0]
            with pytest.raises(
                SpecError, match=option.name if option.name != "strategy" else "unknown strategy"
            ):
                option.check("no-such-choice")
    # every default the configuration has is read from it, and only those
    settings = {o.setting for o in OPTIONS if o.setting is not None}
    assert settings == {"timeout", "metrics-interval", "max-restarts", "hold-timeout", "term-grace"}
    shipped = yaml.safe_load((ROOT / "clustersdk" / "clustersdk.yaml").read_text())["clustersdk"]
    assert settings <= set(shipped)


def test_a_bad_setting_is_refused_naming_it():
    with dask.config.set({"clustersdk.hold-timeout": "soon"}):
        with pytest.raises(
            SpecError,
            match=r"the setting clustersdk.hold-timeout is invalid "
            r"\(hold_timeout must be a positive number.*"
            r"DASK_CLUSTERSDK__HOLD_TIMEOUT",
        ):
            JobSpec(fn=train, world_size=1)


# JobSpec, launch, WireSpec -----------------------------------------------------------------
def test_jobspec_has_one_field_per_option_in_the_tables_order():
    fields = {f.name: f for f in dataclasses.fields(JobSpec)}
    assert [n for n in fields if n in OPTIONS_BY_NAME] == list(options.NAMES)
    assert set(fields) - set(options.NAMES) == {"fn", "args", "kwargs", "id"}
    for option in OPTIONS:
        field = fields[option.name]
        assert field.type == signature_type(option), option.name
        expected = (
            dataclasses.MISSING if option.default is options.REQUIRED else option.launch_default
        )
        assert field.default == expected, option.name


def test_launch_has_one_keyword_per_option_with_the_same_defaults():
    parameters = list(inspect.signature(cs.Cluster.launch).parameters.values())
    assert [p.name for p in parameters[:4]] == ["self", "fn", "args", "kwargs"]
    keywords = parameters[4:]
    assert [p.name for p in keywords] == list(options.names(options.FUNCTION))
    assert_keywords_follow_the_table(keywords)


def test_launch_script_has_one_keyword_per_option_of_a_script_job():
    parameters = list(inspect.signature(cs.Cluster.launch_script).parameters.values())
    assert [p.name for p in parameters[:3]] == ["self", "script", "args"]
    assert parameters[1].default is None  # or module= / command=
    keywords = parameters[3:]
    wanted = [n for n in options.names(options.SCRIPT) if n != "script"]
    assert [p.name for p in keywords] == wanted
    assert_keywords_follow_the_table(keywords)
    doc = inspect.getdoc(cs.Cluster.launch_script)
    for name in wanted:
        assert re.search(rf"\b{name}\b", doc), name


def test_every_option_belongs_to_a_kind_and_the_other_kind_refuses_it(tmp_path):
    assert all(o.kinds and set(o.kinds) <= {"function", "script"} for o in OPTIONS)
    script = tmp_path / "s.py"
    script.write_text("print(1)\n")
    for option in OPTIONS:
        if option.kinds == ("function",) and option.name not in ("model", "plan"):
            value = (
                option.choices[-1]
                if option.choices
                else {
                    "str": "x",
                    "int": 2,
                    "bool": not option.launch_default,
                    "float": 2.0,
                    "dict[str, int]": {"dp": 1},
                    "dict[str, Any]": {"a": 1},
                    "list[str]": ["a"],
                }[option.type.removesuffix(" | None")]
            )
            with pytest.raises(SpecError, match=f"{option.name}= is an option of function jobs"):
                JobSpec(fn=None, world_size=1, script=str(script), **{option.name: value})
    with pytest.raises(SpecError, match="grace= is an option of script jobs"):
        JobSpec(fn=train, world_size=1, grace=5)
    with pytest.raises(
        SpecError, match="give script=, module= or command=, not script= and module="
    ):
        JobSpec(fn=None, world_size=1, script=str(script), module="a.b")
    with pytest.raises(SpecError, match="a training function or a script, not both"):
        JobSpec(fn=train, world_size=1, module="a.b")


def assert_keywords_follow_the_table(keywords: list[inspect.Parameter]) -> None:
    for p in keywords:
        option = OPTIONS_BY_NAME[p.name]
        assert p.kind is inspect.Parameter.KEYWORD_ONLY
        # world_size may be None only with a JobSpec (which holds it)
        wanted = "int | None" if p.name == "world_size" else signature_type(option)
        assert p.annotation == wanted, p.name
        assert p.default == option.launch_default, p.name


def test_wirespec_has_every_option_that_crosses_the_wire():
    fields = {f.name: f for f in dataclasses.fields(WireSpec)}
    wire = {o.name for o in OPTIONS if o.wire is not None}
    assert set(options.NAMES) - wire == NOT_ON_THE_WIRE
    assert set(fields) - wire == WIRE_ONLY
    for name in wire:
        option = OPTIONS_BY_NAME[name]
        assert fields[name].type == WIRE_TYPES.get(name, option.type), name
        if name in ("world_size", "name"):
            continue  # required on the wire
        made = WireSpec(id="j", name="j", world_size=1)
        assert getattr(made, name) == options.default(name), name


def test_to_wire_carries_every_checked_option():
    spec = JobSpec(
        fn=train,
        world_size=4,
        strategy="pp",
        microbatches=4,
        schedule="1f1b",
        split=["b", "c", "d"],
        precision="bf16",
        clip_grad_norm=1,
        keep=5,
        py_modules=[json],
        env={"NCCL_DEBUG": "INFO"},
        hparams={"warmup": 3},
        queue="q",
        priority=7,
        preemptible=False,
        time_limit=10,
        on_hang="fail",
        hang_timeout=30,
        on_error="hold",
        debug=True,
        on_spike="pause",
        min_world_size=2,
        async_checkpoint=False,
    )
    wire = spec.to_wire()
    for name in options.names(options.FUNCTION):
        if name not in NOT_ON_THE_WIRE and name != "py_modules":
            assert getattr(wire, name) == getattr(spec, name), name
    assert wire.py_modules == ["json"] and wire.clip_grad_norm == 1.0 and wire.time_limit == 10.0


def test_a_setting_changes_jobspec_wirespec_and_an_old_journal_entry():
    before = JobSpec(fn=train, world_size=1)
    old = {k: v for k, v in before.to_wire().as_dict().items() if k not in SETTINGS}
    with dask.config.set(CHANGED):
        spec = JobSpec(fn=train, world_size=1)
        assert {k: getattr(spec, k) for k in SETTINGS} == SETTINGS
        assert {k: getattr(spec.to_wire(), k) for k in SETTINGS} == SETTINGS
        made = WireSpec(id="j", name="j", world_size=1)
        assert {k: getattr(made, k) for k in SETTINGS} == SETTINGS
        # a spec journaled before these fields existed reads with today's settings
        assert {k: getattr(WireSpec.from_dict(old), k) for k in SETTINGS} == SETTINGS
        # an explicit value still wins, and None means the setting
        assert JobSpec(fn=train, world_size=1, timeout=3, hold_timeout=None).timeout == 3.0
        assert JobSpec(fn=train, world_size=1, hold_timeout=None).hold_timeout == 90.0
    assert JobSpec(fn=train, world_size=1).timeout == before.timeout == 60.0


def test_an_environment_variable_changes_the_defaults():
    code = (
        "import json; from clustersdk.spec import JobSpec; from clustersdk.protocol import "
        "WireSpec; s = JobSpec(fn=print, world_size=1); w = WireSpec(id='j', name='j', "
        "world_size=1); print(json.dumps([s.timeout, s.max_restarts, w.hold_timeout]))"
    )
    env = {
        **os.environ,
        "DASK_CLUSTERSDK__TIMEOUT": "9",
        "DASK_CLUSTERSDK__MAX_RESTARTS": "4",
        "DASK_CLUSTERSDK__HOLD_TIMEOUT": "120",
    }
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [9.0, 4, 120.0]


def test_an_unknown_wire_field_is_still_refused():
    data = {**WireSpec(id="j", name="j", world_size=1).as_dict(), "gpus_per_rank": 2}
    with pytest.raises(ProtocolError, match="gpus_per_rank"):
        WireSpec.from_dict(data)


def test_renewed_spec_is_a_new_job_keeping_a_chosen_name():
    unnamed = JobSpec(fn=train, world_size=1)
    again = unnamed.renewed()
    assert again.id != unnamed.id and again.name == f"train-{again.id[:6]}"
    named = JobSpec(fn=train, world_size=1, name="mine").renewed(world_size=2)
    assert (named.name, named.world_size) == ("mine", 2)
    with pytest.raises(SpecError, match="world_size must be at least 1, got 0"):
        unnamed.renewed(world_size=0)


# %%distributed ---------------------------------------------------------------------------------
SCALAR = {"int", "float", "str", "bool", "int | str"}


def test_every_option_a_command_line_can_spell_is_a_flag():
    for option in OPTIONS:
        spellable = option.type.removesuffix(" | None") in SCALAR
        assert (flag(option) is not None) == spellable, option.name
        assert (option.name in FLAGS) == (spellable and "function" in option.kinds)
    # the rest are dicts, lists and Python objects: cluster.launch in the cell takes them
    assert set(options.names(options.FUNCTION)) - set(FLAGS) == {
        "mesh",
        "split",
        "model",
        "plan",
        "env",
        "py_modules",
        "hparams",
    }
    assert set(flag_names(options.SCRIPT)) == {
        n for n in options.names(options.SCRIPT) if n not in ("env", "py_modules")
    }


def test_flags_parse_to_launch_keywords_and_default_to_none():
    parser = ClusterMagics.distributed
    args = parse_argstring(
        parser,
        "-n 3 --timeout 5 --priority 7 --not-preemptible "
        "--no-async-checkpoint --cpu-offload --debug --on-nan pause "
        "--checkpoint-every 10 --clip-grad-norm 0.5",
    )
    given = {n: getattr(args, n) for n in FLAGS if getattr(args, n) is not None}
    assert given == {
        "world_size": 3,
        "timeout": 5.0,
        "priority": 7,
        "preemptible": False,
        "async_checkpoint": False,
        "cpu_offload": True,
        "debug": True,
        "on_nan": "pause",
        "checkpoint_every": 10,
        "clip_grad_norm": 0.5,
    }
    args = parse_argstring(parser, "--priority high --no-cpu-offload")
    assert (args.priority, args.cpu_offload, args.timeout, args.strategy) == (
        "high",
        False,
        None,
        None,
    )


def test_magic_help_lists_the_flags_by_group(capsys):
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "clustersdk")
    shell.run_cell("%%distributed --help\npass", store_history=False)
    text = capsys.readouterr().out
    for group, (what, _) in options.GROUPS.items():
        if any(OPTIONS_BY_NAME[n].group == group for n in FLAGS):
            assert f"{group} ({what}):" in text
    assert "the clustersdk.hold-timeout setting" in text and "--not-preemptible" in text


# REST --------------------------------------------------------------------------------------------
JSON_TYPES = {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}


def json_type(annotation: str) -> tuple[str, bool]:
    """(the JSON schema type, nullable) of a Python annotation."""
    base = annotation.removesuffix(" | None")
    if base == "int | str":  # priority: a class name, resolved to an int at submit
        base = "int"
    kind = (
        "object"
        if base.startswith("dict[")
        else "array"
        if base.startswith("list[")
        else JSON_TYPES[base]
    )
    return kind, annotation.endswith(" | None")


def openapi() -> dict:
    path = ROOT / "extension" / "jupyter_clustersdk" / "openapi.yaml"
    return yaml.safe_load(path.read_text())


def test_the_rest_description_of_a_spec_has_every_wirespec_field():
    schema = openapi()["components"]["schemas"]
    assert schema["Job"]["properties"]["spec"] == {"$ref": "#/components/schemas/Spec"}
    properties = schema["Spec"]["properties"]
    fields = {f.name: f for f in dataclasses.fields(WireSpec)}
    assert list(properties) == list(fields)
    for name, field in fields.items():
        kind, nullable = json_type(field.type)
        described = properties[name]
        assert (described["type"], described.get("nullable", False)) == (kind, nullable), name
        option = OPTIONS_BY_NAME.get(name)
        if option is not None and option.choices and not nullable:
            assert described["enum"] == list(option.choices), name


def test_the_rest_update_body_types_the_launch_options_it_changes():
    body = openapi()["paths"]["/clustersdk/api/jobs/{job}/update"]["post"]["requestBody"]
    properties = body["content"]["application/json"]["schema"]["properties"]
    for name in hparams.SPEC_KEYS:
        kind, nullable = json_type(signature_type(OPTIONS_BY_NAME[name]))
        nullable = nullable and OPTIONS_BY_NAME[name].setting is None  # a setting can't be unset
        described = properties[name]
        assert (described["type"], described.get("nullable", False)) == (kind, nullable), name


# launch's docstring ------------------------------------------------------------------------------
def test_launch_docstring_lists_every_option_in_its_group():
    doc = inspect.getdoc(cs.Cluster.launch)
    listed = {}
    for block in re.findall(
        r"^- (\w+) \(:doc:`/([^`]+)`\): (.*?)(?=^- |^$)", doc + "\n\n", re.M | re.S
    ):
        group, page, names = block
        listed[group] = (page, names.split())
    of_functions = {
        group: [o.name for o in OPTIONS if o.group == group and "function" in o.kinds]
        for group in options.GROUPS
    }
    assert listed == {
        group: (page, of_functions[group])
        for group, (_, page) in options.GROUPS.items()
        if of_functions[group]
    }
    # each group's page is one of the documentation's (the docs build checks the links)
    for _, page in options.GROUPS.values():
        assert (ROOT / "docs" / f"{page}.md").is_file(), page


# launch on a cluster -----------------------------------------------------------------------------
def test_launch_without_world_size_says_so_as_before(idle):
    with pytest.raises(TypeError, match=r"missing 1 required keyword-only argument: 'world_size'"):
        idle.launch(workloads.count_to)


def test_launch_takes_a_jobspec_and_each_launch_is_a_new_job(idle):
    spec = JobSpec(fn=workloads.count_to, world_size=2, kwargs={"steps": 3})
    first = idle.launch(spec)
    assert first.wait(timeout=60) == "done"
    second = idle.launch(spec)
    assert second.wait(timeout=60) == "done"
    assert first.id != second.id and first.name != second.name
    assert first.name.startswith("count_to-") and first.world_size == second.world_size == 2
    named = dataclasses.replace(spec, name="from-a-spec", world_size=1)
    job = idle.launch(named)
    assert job.wait(timeout=60) == "done"
    assert cs.Job.attach(idle, "from-a-spec").id == job.id and job.world_size == 1


@pytest.mark.parametrize(
    "extra, named",
    [
        ({"world_size": 4}, "world_size=4"),
        ({"strategy": "fsdp", "keep": 5}, "strategy='fsdp', keep=5"),
        ({"kwargs": {"steps": 2}}, "kwargs={'steps': 2}"),
        ({"timeout": 5.0}, "timeout=5.0"),
    ],
)
def test_a_jobspec_with_other_arguments_is_refused_naming_them(idle, extra, named):
    spec = JobSpec(fn=workloads.count_to, world_size=1)
    before = len(idle.jobs())
    with pytest.raises(
        SpecError,
        match=re.escape(
            f"launch(spec) takes every option from the JobSpec, but was also given {named}; "
            f"change the spec instead, e.g. cluster.launch(dataclasses.replace(spec, {named}))"
        ),
    ):
        idle.launch(spec, **extra)
    assert len(idle.jobs()) == before


def test_a_setting_reaches_the_ranks_through_launch_and_the_magic(idle):
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "clustersdk")
    shell.user_ns["cluster"] = idle
    try:
        with dask.config.set(CHANGED):
            job = idle.launch(workloads.count_to, world_size=1, kwargs={"steps": 2})
            cell = shell.run_cell(
                "%%distributed -n 1 --no-wait --cluster cluster\n"
                "return [ctx.spec.timeout, ctx.spec.metrics_interval, "
                "ctx.spec.max_restarts, ctx.spec.hold_timeout]",
                store_history=False,
            )
        assert cell.success, cell.error_in_exec
        assert cell.result.wait(timeout=60) == list(SETTINGS.values())
        assert job.wait(timeout=60) == "done"
        kept = idle.job_record(job.id)["spec"]  # what the scheduler journaled
        assert {k: kept[k] for k in SETTINGS} == SETTINGS
    finally:
        shell.user_ns.pop("cluster", None)
