"""One verb per job action at every door (clustersdk.actions.JOB_ACTIONS): the control
operation and ControlClient's coroutine, Job's method, the CLI command and its help, the
%job magic, the REST route and its description, the notebook dashboard's and the lab
panel's buttons with the states that enable them."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import yaml
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from clustersdk import Job
from clustersdk.__main__ import parse, parser
from clustersdk.actions import BUTTONS, JOB_ACTIONS, VERBS, WAITING
from clustersdk.client import ControlClient
from clustersdk.protocol import Op
from clustersdk.widgets.model import ACTIONS as WIDGET_BUTTONS

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "extension" / "labextension" / "src"


def test_every_action_is_an_operation_a_coroutine_and_a_job_method():
    for action in JOB_ACTIONS:
        assert Op(action.verb).value == action.verb
        assert inspect.iscoroutinefunction(getattr(ControlClient, action.verb)), action.verb
        method = getattr(Job, action.verb)
        assert callable(method) and method.__doc__, action.verb
        if action.verb in WAITING:  # returns once the ranks did it: it takes a timeout
            assert "timeout" in inspect.signature(method).parameters, action.verb


def test_every_action_is_a_cli_command_with_the_tables_help():
    commands = next(
        a for a in parser()._actions if a.dest == "command"
    )  # the subcommands, with their help lines
    helps = {c.dest: c.help for c in commands._choices_actions}
    for action in JOB_ACTIONS:
        assert helps[action.verb] == action.help
        args = parse([action.verb, "some-job"])
        assert (args.command, args.job) == (action.verb, "some-job")
        assert hasattr(args, "timeout") == (action.verb in (*WAITING, "stop")), action.verb


def test_every_action_is_a_job_magic_verb():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "clustersdk")
    with pytest.raises(UsageError) as refused:
        shell.run_line_magic("job", "pause")  # no job named: the usage names every verb
    listed = re.search(r"%job \{([^}]*)\} NAME", str(refused.value))[1].split("|")
    assert listed[: len(VERBS)] == list(VERBS)


def test_every_action_is_a_described_rest_route():
    from jupyter_clustersdk.handlers import ROUTES
    from jupyter_clustersdk.manager import ACTIONS, WAITING_ACTIONS

    assert (ACTIONS, WAITING_ACTIONS) == (VERBS, WAITING)
    (pattern,) = [p for p, _ in ROUTES if "(?P<action>" in p]
    paths = yaml.safe_load((ROOT / "extension" / "jupyter_clustersdk" / "openapi.yaml").read_text())
    for verb in VERBS:
        assert re.fullmatch(pattern, f"/clustersdk/api/jobs/a/{verb}"), verb
        post = paths["paths"][f"/clustersdk/api/jobs/{{job}}/{verb}"]["post"]
        assert post["operationId"] == f"{verb}Job"


def test_the_dashboards_buttons_are_the_tables():
    assert WIDGET_BUTTONS == BUTTONS and "restart" not in BUTTONS  # a HELD job's own view
    types = (LAB / "types.ts").read_text()
    listed = re.search(r"export const ACTIONS = \[(.*?)\] as const", types, re.S)[1]
    assert re.findall(r"'(\w+)'", listed) == list(BUTTONS)
    models = (LAB / "models.ts").read_text()
    table = re.search(r"const ALLOWED: Record<Action, string\[\]> = \{(.*?)\n\};", models, re.S)[1]
    allowed = {
        verb: frozenset(re.findall(r"'(\w+)'", states))
        for verb, states in re.findall(r"(\w+): \[(.*?)\]", table, re.S)
    }
    assert allowed == BUTTONS
