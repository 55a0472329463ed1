"""``ctx.breakpoint()`` end to end: the whole job pauses at one step, a pdb session on the
chosen rank is driven through the notebook console's widget model (its input line and
Send button, as a user's typing and clicks drive them), ``c`` (or ``job.resume()``)
runs the job on; without ``debug=True`` the call does nothing."""

from __future__ import annotations

import html

import cloudpickle
import pytest

import clustersdk as cs
from clustersdk import widgets
from clustersdk.runtime.context import TrainContext

from . import workloads, workloads_debug
from .helpers import Statuses, losses, wait_for

cloudpickle.register_pickle_by_value(workloads_debug)


def type_line(console, text: str) -> None:
    """What a user does: type into the input line, click Send."""
    console.input.value = text
    console.send_button.click()


def prompts(console) -> int:
    return console.text.count("(Pdb rank 0) ")


def answer(console, text: str) -> None:
    """Send ``text`` and wait for the session's next prompt (its answer came before it)."""
    before = prompts(console)
    type_line(console, text)
    wait_for(lambda: prompts(console) > before, timeout=60)


def test_the_console_drives_pdb_at_a_breakpoint_and_continue_finishes_the_job(idle):
    job = idle.launch(
        workloads_debug.break_at,
        kwargs={"steps": 12, "at": (3,)},
        world_size=2,
        debug=True,
        name="debugged",
    )
    seen = Statuses(job)
    dash = widgets.dashboard(job)
    wait_for(lambda: job.status is cs.JobStatus.PAUSED, timeout=90)
    assert job.reason.startswith("at ctx.breakpoint() on rank 0, step 3: its pdb console is open")
    console = job.console()
    wait_for(lambda: prompts(console) == 1, timeout=60)
    assert console.text.startswith("[rank 0: ctx.breakpoint() #1 at step 3]\n")
    assert not console.send_button.disabled
    wait_for(lambda: dash.console_box.children == (console.widget,), timeout=30)  # shown there

    answer(console, "p x")
    assert "(Pdb rank 0) p x\n21.5\n" in console.text  # x = 3 * 7 + 0.5, on rank 0
    answer(console, "n")  # a step in the rank's own code
    answer(console, "p y")
    assert "(Pdb rank 0) p y\n43.0\n" in console.text
    answer(console, "p undefined_name")
    assert "*** NameError: name 'undefined_name' is not defined" in console.text
    assert job.status is cs.JobStatus.PAUSED  # the whole job waits meanwhile
    other = job.stacks()[1]
    assert "phase paused" in other.splitlines()[0] and "stop_here" in other
    # the rank waiting at its breakpoint runs job.run meanwhile (rank 0 is in pdb)
    assert job.run(lambda ctx: (ctx.rank, ctx.step), ranks=[1], timeout=30) == {1: (1, 3)}

    type_line(console, "c")
    assert job.wait(timeout=120) == {"steps": 12, "breaks": [3]}
    # the transcript follows the job's events, which may reach the client after its end
    wait_for(lambda: "(Pdb rank 0) c\n(continuing: the job runs on)\n" in console.text, timeout=30)
    assert seen.after("PAUSED") == ["PAUSED", "RUNNING", "FINISHED"]
    assert sorted(losses(job, 1)) == list(range(12))  # every rank did every step, once
    wait_for(lambda: console.send_button.disabled, timeout=30)  # no session open now


def test_resume_ends_a_session_and_the_next_breakpoint_pauses_again_and_quit_runs_on(idle):
    job = idle.launch(
        workloads_debug.break_at,
        kwargs={"steps": 12, "at": (2, 7)},
        world_size=2,
        debug=True,
        name="twice",
    )
    console = job.console()
    wait_for(lambda: job.status is cs.JobStatus.PAUSED and prompts(console) == 1, timeout=90)
    assert job.resume() is cs.JobStatus.RUNNING  # as `continue`
    wait_for(
        lambda: "ctx.breakpoint() #2 at step 7" in console.text and prompts(console) == 2,
        timeout=90,
    )
    assert "quit  # job.resume()\n(continuing: the job runs on)\n" in console.text
    assert job.status is cs.JobStatus.PAUSED and "step 7" in job.reason
    type_line(console, "q")  # leaves the debugger: the job runs on
    assert job.wait(timeout=120) == {"steps": 12, "breaks": [2, 7]}


def test_a_stop_at_a_breakpoint_stops_the_job_at_its_next_step_boundary(idle):
    job = idle.launch(
        workloads_debug.break_at,
        kwargs={"steps": 1000, "at": (4,)},
        world_size=2,
        debug=True,
        name="stopped-there",
    )
    console = job.console()
    wait_for(lambda: prompts(console) == 1, timeout=90)
    assert job.stop(timeout=60) is cs.JobStatus.STOPPED
    wait_for(lambda: "quit  # the job is leaving" in console.text, timeout=30)
    assert 4 <= max(losses(job, 0)) < 999  # it left at a boundary after the breakpoint
    wait_for(lambda: not any(s["job"] for s in idle.slots()), timeout=30)


def test_without_debug_a_breakpoint_does_nothing(idle):
    job = idle.launch(
        workloads_debug.break_always, kwargs={"steps": 200}, world_size=2, name="not-debugged"
    )
    seen = Statuses(job)
    assert job.wait(timeout=120) == 200  # 400 calls, not one pause
    assert "PAUSED" not in seen.seen
    state = idle.sync(idle.control.console, job.id)
    assert not state["chunks"] and not state["sessions"]


def test_without_debug_the_call_is_one_attribute_check():
    class Spec:
        debug = False

    class Probe:
        spec = Spec()

        def __getattr__(self, name):  # anything beyond the check would land here
            raise AssertionError(f"ctx.breakpoint() touched ctx.{name}")

    TrainContext.breakpoint(Probe(), ranks=[0])  # no report, no control words, no frame


def test_bad_ranks_fail_the_job_naming_them_and_input_without_a_session_is_refused(idle):
    job = idle.launch(workloads_debug.break_badly, world_size=2, debug=True, name="bad-ranks")
    with pytest.raises(
        cs.JobFailedError,
        match=r"ctx.breakpoint\(ranks=\[5\]\): ranks must be "
        r"ranks of this job, from 0 to 1",
    ):
        job.wait(timeout=120)
    running = idle.launch(workloads.spin, world_size=2, debug=True, name="no-session")
    wait_for(lambda: running.status is cs.JobStatus.RUNNING, timeout=90)
    with pytest.raises(
        cs.InvalidTransitionError,
        match=r"has no debugger session open on rank 1 "
        r"\(open: none\); ctx.breakpoint\(\)",
    ):
        idle.sync(idle.control.console, running.id, rank=1, text="p 1")
    console = running.console()
    type_line(console, "p 1")
    assert (
        "not sent: job 'no-session' has no debugger session open; ctx.breakpoint() opens "
        "one in a job launched with debug=True" in html.unescape(console.status.value)
    )
    running.stop()
