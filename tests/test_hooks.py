"""The client API's hooks (:mod:`clustersdk.hooks`): the package face provides every hook
the client calls, a missing one is a clear error, and what a plain script prints through
them is what the presentation renders."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import clustersdk
from clustersdk import hooks
from clustersdk.cluster.base import QueueView
from clustersdk.widgets.queue import queue_html, queue_text

ROOT = Path(__file__).resolve().parents[1]

QUEUES = {
    "slots": 4,
    "free": 1,
    "per_user_cap": None,
    "users": {"ana": 3},
    "queues": [
        {
            "name": "default",
            "guaranteed": 0,
            "limit": None,
            "used": 3,
            "holding": [
                {
                    "name": "big",
                    "owner": "ana",
                    "priority_name": "high",
                    "slots": 3,
                    "status": "running",
                    "ends_by": None,
                }
            ],
            "waiting": [
                {
                    "name": "small",
                    "owner": "bo",
                    "priority_name": "normal",
                    "world_size": 2,
                    "reason": "waiting for 2 slots to be free",
                    "estimated_start": None,
                }
            ],
        }
    ],
}


def hooks_the_client_uses() -> set[str]:
    """The names of every ``hooks.call(...)`` / ``hooks.provided(...)`` in clustersdk/,
    outside the package face (which provides them)."""
    names = set()
    for path in (ROOT / "clustersdk").rglob("*.py"):
        if path == ROOT / "clustersdk" / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "hooks"
                and node.func.attr in ("call", "provided")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names.add(node.args[0].value)
    return names


def test_the_package_face_provides_every_hook_the_client_calls():
    used = hooks_the_client_uses()
    assert {
        "job_display",
        "cluster_display",
        "job_console",
        "queue_text",
        "queue_html",
        "doctor",
    } <= used
    assert [name for name in sorted(used) if not hooks.provided(name)] == []


def test_a_hook_nobody_provides_is_a_clear_error_and_a_provider_can_be_put_back():
    with pytest.raises(hooks.HookMissingError, match="nothing provides the hook 'nope'"):
        hooks.call("nope")
    previous = hooks.provide("queue_text", lambda data: "replaced")
    try:
        assert repr(QueueView(QUEUES)) == "replaced"
    finally:
        hooks.provide("queue_text", previous)
    assert repr(QueueView(QUEUES)) == queue_text(QUEUES)
    with pytest.raises(TypeError, match="must be callable"):
        hooks.provide("queue_text", "not a function")


def test_without_a_provider_the_queue_still_reads_as_data():
    text, html = hooks.withdraw("queue_text"), hooks.withdraw("queue_html")
    try:
        view = QueueView(QUEUES)
        assert repr(view) == "<QueueView 1 queue(s), 1 holding, 1 waiting>"
        assert view._repr_html_() is None  # IPython then shows the text
        assert [j["name"] for j in view.waiting()] == ["small"]
    finally:
        hooks.provide("queue_text", text)
        hooks.provide("queue_html", html)


def test_the_queue_shows_what_the_presentation_renders():
    view = QueueView(QUEUES)
    assert repr(view) == queue_text(QUEUES)
    assert "waiting for 2 slots to be free" in repr(view)
    assert view._repr_html_() == queue_html(QUEUES) and "small" in view._repr_html_()


def test_a_plain_script_prints_the_queue_as_text_without_ipython(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(
        "import json, sys\n"
        "from clustersdk.cluster.base import QueueView\n"
        f"print(QueueView(json.loads({json.dumps(json.dumps(QUEUES))})))\n"
        "print('IPython' in sys.modules)\n",
        encoding="utf-8",
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out == queue_text(QUEUES) + "\nFalse\n"


def test_the_face_wires_hooks_without_importing_presentation():
    code = (
        "import sys, clustersdk, clustersdk.hooks as h\n"
        "print(sorted(n for n in ('job_display', 'doctor') if h.provided(n)), "
        "any(m.startswith(('clustersdk.widgets', 'clustersdk.doctor')) for m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.strip() == "['doctor', 'job_display'] False"
    assert clustersdk.hooks is hooks
