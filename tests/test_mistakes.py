"""The silent mistakes of a ported script, made loud (or harmless)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import cloudpickle
import pytest
import torch

import clustersdk as cs

from . import workloads_data as W

cloudpickle.register_pickle_by_value(W)

GUARD = 'put the cluster under  if __name__ == "__main__":'
SCRIPTS = {
    "top-level": """
        import clustersdk as cs
        cluster = cs.Cluster.local(workers=1, state_dir=STATE)
    """,
    "helper-at-top-level": """
        import clustersdk as cs
        def main():
            cs.Cluster.local(workers=1, state_dir=STATE).close()
        main()
    """,
    # a guard that also lets the workers in: only they can tell
    "leaky-guard": """
        import clustersdk as cs
        if __name__ in ("__main__", "__mp_main__"):
            cs.Cluster.local(workers=1, state_dir=STATE).close()
    """,
    "guarded": """
        import clustersdk as cs
        def main():
            with cs.Cluster.local(workers=1, state_dir=STATE) as cluster:
                print("slots", len(cluster.slots()))
        if __name__ == "__main__":
            main()
    """,
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_script_without_the_main_guard_is_told_in_one_line(tmp_path, name):
    script = tmp_path / f"{name.replace('-', '_')}.py"
    script.write_text(f"STATE = {str(tmp_path / 'state')!r}\n" + textwrap.dedent(SCRIPTS[name]))
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    if name == "guarded":
        assert run.returncode == 0, run.stderr
        assert "slots 1" in run.stdout
        return
    assert run.returncode != 0
    said = [line for line in run.stderr.splitlines() if GUARD in line]
    assert said and f"{script.name}" in said[0], run.stderr
    if name != "leaky-guard":  # refused before any worker started
        assert "Nanny" not in run.stderr and run.stderr.count("Traceback") == 1


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_an_optimizer_built_before_prepare_trains_the_prepared_model(idle, strategy):
    after = idle.launch(
        W.optimizer_before_prepare, kwargs={"when": "after"}, world_size=2, strategy=strategy
    ).wait(timeout=120)
    job = idle.launch(
        W.optimizer_before_prepare, kwargs={"when": "before"}, world_size=2, strategy=strategy
    )
    before = job.wait(timeout=120)
    assert before["losses"] == after["losses"]
    for key, value in after["state"]["model"].items():
        assert torch.equal(before["state"]["model"][key], value), key
        assert not torch.equal(value, before["initial"][key]), key  # it did train
    assert after["state"]["optim"]["state"].keys() == before["state"]["optim"]["state"].keys()
    rebound = "the AdamW optimizer was built before ctx.prepare" in job.logs(0)
    assert rebound == (strategy == "fsdp")  # DDP keeps the parameters: nothing to rebind


@pytest.mark.parametrize(
    "when, message",
    [
        ("stepped", "has stepped on them already: build it after model = ctx.prepare\\(model\\)"),
        (
            "stale-scheduler",
            "the LR scheduler registered as 'scheduler' adjusts an optimizer that "
            "is not registered and did not step in the first step",
        ),
    ],
)
def test_what_cannot_be_rebound_fails_at_the_first_step_naming_the_fix(idle, when, message):
    job = idle.launch(
        W.optimizer_before_prepare, kwargs={"when": when}, world_size=2, strategy="fsdp"
    )
    with pytest.raises(cs.JobFailedError, match=message) as info:
        job.wait(timeout=120)
    assert info.value.exc_type == "SpecError"
    assert not [r for r in job.history() if r["step"] >= 1]  # no second step ran
