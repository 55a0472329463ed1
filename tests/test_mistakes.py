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


def no_context(lr=1e-3):
    return lr


def needs_lr(ctx, *, lr):
    return lr


def takes_lr(ctx, lr=1e-3):
    return lr


def nothing():
    return None


@pytest.mark.parametrize(
    "fn, kwargs, said",
    [
        (
            no_context,
            {},
            "its first parameter 'lr' has a default (0.001): write def no_context(ctx, lr=0.001)",
        ),
        (nothing, {}, "takes no positional argument: write def nothing(ctx)"),
        (needs_lr, {}, "needs_lr(ctx) does not fit it: missing a required argument: 'lr'"),
        (
            takes_lr,
            {"lr": 0.1, "epochs": 3},
            "got an unexpected keyword argument 'epochs'; leave epochs out of kwargs=, "
            "or write def takes_lr(ctx, lr=0.001, epochs=...)",
        ),
    ],
    ids=["first-has-default", "no-parameter", "missing-kwarg", "unknown-kwarg"],
)
def test_a_function_that_cannot_be_called_so_is_refused_at_launch_in_one_line(
    idle, fn, kwargs, said
):
    before = len(idle.job_records())
    with pytest.raises(cs.SpecError) as info:
        idle.launch(fn, kwargs=kwargs, world_size=1)
    message = str(info.value)
    assert "\n" not in message and f"the training function {fn.__name__}(" in message
    assert said in message
    assert len(idle.job_records()) == before  # nothing was queued


def test_a_closed_cluster_says_so_and_what_to_do(tmp_path):
    cluster = cs.Cluster.local(workers=1, state_dir=str(tmp_path / "state"))
    address = cluster.scheduler_address
    job = cluster.launch(W.three_ranks_report, kwargs={"batches": 2}, world_size=1, name="done")
    job.wait(timeout=120)
    cluster.close()

    calls = {
        "cluster.launch": lambda: cluster.launch(takes_lr, world_size=1),
        "cluster.jobs": cluster.jobs,
        "cluster.job": lambda: cluster.job("done"),
        "cluster.slots": cluster.slots,
        "cluster.queue": cluster.queue,
        "job.pause": job.pause,
        "job.stop": job.stop,
        "job.wait": job.wait,
        "job.history": job.history,
        "job.on_event": lambda: job.on_event(print),
    }
    for call, run in calls.items():
        with pytest.raises(cs.ClusterClosedError) as info:
            run()
            pytest.fail(f"{call} on a closed cluster did not raise")
        message = str(info.value)
        assert message.startswith(
            "the Cluster is closed: cluster.close() shut the local cluster"
        ), call
        assert address in message and "start a new one with cs.Cluster.local(...)" in message, call
        assert info.value.address == address and isinstance(info.value, RuntimeError)
    # a job's state is not guessed from what its handle last saw: it says that too
    for ask in (lambda: job.status, job.info):
        with pytest.raises(
            cs.ClusterClosedError,
            match="can't ask about job 'done' \\(last seen FINISHED\\): the Cluster is closed",
        ):
            ask()
    # what needs no cluster still answers
    assert cluster.closed and cluster.scheduler_address == address
    assert repr(cluster) == "<Cluster local (closed)>" and "'done' FINISHED" in repr(job)
    cluster.close()  # again: nothing happens


def test_a_closed_handle_on_a_cluster_that_goes_on_says_connect_again(idle):
    handle = cs.Cluster.connect(idle.client)
    handle.close()
    with pytest.raises(cs.ClusterClosedError) as info:
        handle.job_records()
    assert str(info.value) == (
        f"the Cluster is closed: cluster.close() let go of {idle.scheduler_address}, whose jobs "
        f"go on; connect again with cs.Cluster.connect({idle.scheduler_address!r})"
    )
    assert idle.slots()  # the cluster itself is untouched
