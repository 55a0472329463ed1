"""The lifecycle's rules for script jobs (launch_script), with no cluster: a rank's non-zero
exit ends the gang and restarts it within max_restarts as torchrun does, else fails naming
the rank and its exit code; what a script's ranks accept decides which requests reach it."""

from __future__ import annotations

import pytest

from clustersdk.control import events as ev
from clustersdk.errors import InvalidTransitionError, SpecError
from clustersdk.protocol import ExitStatus, WireSpec, Word
from clustersdk.runtime.environ import torchrun_environ
from clustersdk.runtime.scripts import read_error_file
from clustersdk.status import JobStatus

from .helpers import exit_all, make, of, running, statuses

S = JobStatus
SCRIPT = {"script": "/work/train.py", "args": ["--lr", "1"], "fn": "train.py"}


def exit_code_3(rank: int = 1) -> dict:
    return {
        "rank": rank,
        "type": "ScriptExit",
        "message": "exited with code 3",
        "traceback": "last 1 line(s) of its stderr:\nboom",
        "exit_code": 3,
        "signal": None,
    }


def test_one_rank_s_exit_stops_the_others_at_once_and_restarts_the_gang():
    job = running(3, max_restarts=1, **SCRIPT)
    actions = job.handle(ev.Failed(1, 0, exit_code_3()), 2.0)
    # the others are told to stop now (SIGTERM), not after the failure grace
    assert of(actions, ev.SendControl)[-1].words[Word.STOP] == 1
    assert job.status is S.RUNNING  # a lost worker could still explain it: wait and see
    actions = job.handle(ev.Exited(1, 0, ExitStatus.FAILED), 2.1)
    actions += exit_all(job, ExitStatus.STOPPED, ranks=[0, 2])
    assert statuses(actions) == ["RESTARTING", "QUEUED"]
    assert job.restarts == 1 and job.attempt == 1
    restarted = [a for a in of(actions, ev.Record) if a.kind == "restarted"]
    assert restarted[0].message == "rank 1 exited with code 3; restart 1 of 1"
    assert restarted[0].data["rank"] == 1 and restarted[0].data["exit_code"] == 3
    assert of(actions, ev.Enqueue) == [ev.Enqueue(front=True)]


def test_the_grace_decides_when_the_others_are_slow_to_leave():
    job = running(2, max_restarts=2, **SCRIPT)
    job.handle(ev.Failed(0, 0, exit_code_3(0)), 2.0)
    actions = job.handle(ev.GraceExpired(0), 5.0)
    assert statuses(actions) == ["RESTARTING"]
    actions = exit_all(job, ExitStatus.STOPPED)
    assert statuses(actions) == ["QUEUED"]


def test_without_restarts_left_the_exit_code_is_the_cause():
    job = running(3, **SCRIPT)
    job.handle(ev.Failed(1, 0, exit_code_3()), 2.0)
    job.handle(ev.Exited(1, 0, ExitStatus.FAILED), 2.1)
    actions = exit_all(job, ExitStatus.STOPPED, ranks=[0, 2])
    assert statuses(actions) == ["FAILED"]
    error = next(a for a in of(actions, ev.Journal) if "error" in a.fields).fields["error"]
    assert (error["rank"], error["type"], error["message"]) == (
        1,
        "ScriptExit",
        "exited with code 3",
    )


def test_a_function_job_s_raise_still_fails_it_within_its_restart_budget():
    job = running(2, max_restarts=3)
    job.handle(
        ev.Failed(1, 0, {"rank": 1, "type": "ValueError", "message": "bad", "traceback": ""}), 2.0
    )
    actions = job.handle(ev.GraceExpired(0), 5.0)
    assert statuses(actions) == ["FAILED"]


def test_pause_and_checkpoint_need_every_rank_to_have_opted_in():
    job = running(2, **SCRIPT)
    assert job.controls == {"stop", "suspend"}
    with pytest.raises(InvalidTransitionError, match="does not accept pause requests"):
        job.handle(ev.PauseRequested(), 2.0)
    job.handle(ev.Controls(0, 0, ("pause", "checkpoint")), 2.0)
    assert job.controls == {"stop", "suspend"}  # rank 1 has not said yet
    actions = job.handle(ev.Controls(1, 0, ("pause",)), 2.0)
    assert job.controls == {"stop", "suspend", "pause"}
    assert [a.fields for a in of(actions, ev.Journal)] == [
        {"controls": ["pause", "stop", "suspend"]}
    ]
    job.handle(ev.PauseRequested(), 3.0)  # asked now
    with pytest.raises(InvalidTransitionError, match="does not accept checkpoint requests"):
        job.handle(ev.CheckpointRequested(), 3.0)


def test_a_script_suspends_without_checkpoint_dir_and_comes_back_as_a_new_attempt():
    job = running(2, **SCRIPT)
    job.handle(ev.SuspendRequested(), 2.0)
    actions = exit_all(job, ExitStatus.SUSPENDED)
    assert statuses(actions) == ["SUSPENDED"]
    job.handle(ev.ResumeRequested(), 3.0)
    assert job.status is S.QUEUED and job.attempt == 1


@pytest.mark.parametrize(
    "event, what",
    [
        (ev.RunRequested(b"", None, 10), "job.run"),
        (ev.UpdateRequested({"lr": 0.1}), "job.update"),
        (ev.ProfileRequested(5), "job.profile"),
    ],
)
def test_function_only_requests_are_refused_naming_them(event, what):
    job = running(2, **SCRIPT)
    with pytest.raises(
        SpecError, match=f"runs train.py as a script: {what} needs a training function's ranks"
    ):
        job.handle(event, 2.0)


def test_a_function_job_accepts_every_control():
    assert make(2).controls == {"stop", "suspend", "pause", "checkpoint"}


# the rank's side, pure parts --------------------------------------------------------------
def test_torchrun_s_node_layout_from_the_hosts_of_the_gang():
    spec = WireSpec(
        id="j9",
        name="j",
        world_size=4,
        max_restarts=2,
        attempt=1,
        env={"OMP_NUM_THREADS": "4"},
        **SCRIPT,
    )
    hosts = ["a", "a", "b", "b"]
    envs = [torchrun_environ(r, hosts, "a", 29500, spec, False, "/e", {}) for r in range(4)]
    assert [(e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"]) for e in envs] == [
        ("0", "0", "0"),
        ("1", "1", "0"),
        ("2", "0", "1"),
        ("3", "1", "1"),
    ]
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["GROUP_WORLD_SIZE"] for e in envs} == {"2"}
    assert envs[3]["TORCHELASTIC_RESTART_COUNT"] == "1"
    assert envs[3]["TORCHELASTIC_MAX_RESTARTS"] == "2"
    assert envs[3]["TORCHELASTIC_RUN_ID"] == "j9"
    assert envs[3]["OMP_NUM_THREADS"] == "4"  # the job's env wins, as over torchrun's 1
    gpu = torchrun_environ(3, hosts, "a", 29500, spec, True, "/e", {})
    assert gpu["LOCAL_RANK"] == "0"  # its worker's one GPU (--virtual-local-rank)
    alone = torchrun_environ(
        0, ["a"], "a", 1, WireSpec(id="x", name="x", world_size=1), False, "/e", {}
    )
    assert "OMP_NUM_THREADS" not in alone  # torchrun sets it only for several per host


def test_the_error_file_of_torch_s_record(tmp_path):
    path = tmp_path / "error.json"
    path.write_text(
        '{"message": {"message": "ValueError: bad batch 7", "extraInfo": '
        '{"py_callstack": "Traceback...\\nValueError: bad batch 7", '
        '"timestamp": "1"}}}'
    )
    assert read_error_file(str(path)) == (
        "ValueError",
        "bad batch 7",
        "Traceback...\nValueError: bad batch 7",
    )
    path.write_text("not json")
    assert read_error_file(str(path)) is None
