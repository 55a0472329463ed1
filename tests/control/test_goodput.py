"""The goodput bookkeeping's rules (clustersdk/control/goodput.py), without a cluster."""

from __future__ import annotations

import doctest

from hypothesis import given
from hypothesis import strategies as st

from clustersdk.control import goodput
from clustersdk.control.goodput import BUCKETS, Goodput


def row(step: int, total: float, checkpoint: float = 0.0) -> list[float]:
    return [step, 0.0, total - checkpoint, 0.0, checkpoint, 0.0, total]


def test_the_example_in_the_docstring_runs():
    assert doctest.testmod(goodput).failed == 0


def test_waiting_before_the_first_start_is_not_wall_time():
    g = Goodput()
    g.status("QUEUED", 0.0)
    g.status("STARTING", 50.0)
    g.status("RUNNING", 51.0)
    g.steps([row(0, 2.0)], now=53.0)
    s = g.summary(60.0)  # the step under way since 53 is not counted yet
    assert s["wall"] == 3.0 and s["seconds"]["productive"] == 2.0 and s["goodput"] == 0.6667


def test_a_restart_from_scratch_loses_every_step_and_a_step_done_again_counts_once():
    g = Goodput()
    g.status("STARTING", 0.0)
    g.status("RUNNING", 1.0)
    g.steps([row(0, 1.0), row(1, 1.0), row(2, 1.0)], now=4.0)
    g.rollback(0)  # no checkpoint: back to the start
    g.status("QUEUED", 4.0)
    g.status("STARTING", 4.0)
    g.status("RUNNING", 5.0)
    g.steps([row(0, 1.0), row(1, 1.0)], now=7.0)
    g.status("FINISHED", 7.0)
    s = g.summary(100.0)
    assert (s["steps"], s["lost_steps"]) == (2, 3)
    assert s["seconds"]["productive"] == 2.0 and s["seconds"]["lost"] == 3.0
    assert s["wall"] == 7.0  # ended: no more time counted


def test_rows_of_a_rolled_back_gang_that_come_late_land_where_they_belong():
    g = Goodput()
    g.status("STARTING", 0.0)
    g.status("RUNNING", 0.0)
    g.steps([row(0, 1.0), row(1, 1.0)], now=2.0)
    g.rollback(3)  # its checkpoint holds steps 0..2; step 2 and 3 were still on their way
    g.late([row(2, 1.0), row(3, 1.0)])
    s = g.summary(4.0)
    assert (s["steps"], s["lost_steps"]) == (3, 1)


def test_checkpoint_stalls_and_states_off_slots_have_their_own_buckets():
    g = Goodput()
    g.status("STARTING", 0.0)
    g.status("RUNNING", 1.0)
    g.steps([row(0, 3.0, checkpoint=1.0)], now=4.0)
    g.status("PAUSED", 4.0)
    g.status("RUNNING", 6.0)
    g.status("HUNG", 6.0)
    g.status("RESTARTING", 9.0)
    g.status("QUEUED", 10.0)
    s = g.summary(15.0)["seconds"]
    assert s == {
        "productive": 2.0,
        "checkpoint": 1.0,
        "lost": 0.0,
        "startup": 2.0,  # before the step, and winding down
        "hung": 3.0,
        "queued": 5.0,
        "paused": 2.0,
    }


def test_a_restarted_scheduler_goes_on_from_what_the_record_kept():
    g = Goodput()
    g.status("STARTING", 0.0)
    g.status("RUNNING", 1.0)
    g.steps([row(0, 1.0), row(1, 1.0)], now=3.0)
    kept = g.summary(3.0)
    again = Goodput(kept)  # the scheduler died while it ran; the next one restarts it
    again.discard([row(1, 1.0)])  # the steps since its checkpoint (before step 1)
    again.status("QUEUED", 5.0)
    s = again.summary(6.0)
    assert (s["steps"], s["lost_steps"]) == (1, 1)
    assert s["seconds"]["queued"] == 1.0 and s["wall"] == 6.0


def test_a_job_without_step_times_has_no_goodput():
    g = Goodput()
    g.status("STARTING", 0.0)
    g.status("RUNNING", 1.0)
    s = g.summary(5.0)
    assert s["goodput"] is None and s["seconds"]["startup"] == 5.0


STATES = ["STARTING", "RUNNING", "PAUSED", "HUNG", "RESTARTING", "QUEUED", "SUSPENDED"]


@given(
    st.lists(
        st.tuples(
            st.sampled_from([*STATES, "steps", "rollback", "late"]),
            st.floats(0, 5),
            st.integers(0, 8),
        ),
        max_size=40,
    )
)
def test_the_buckets_always_add_up_to_the_wall_time(script):
    g, now, step = Goodput(), 0.0, 0
    for what, dt, n in script:
        now += dt
        if what == "steps":
            g.steps([row(step + i, 0.25, 0.05) for i in range(n)], now=now)
            step += n
        elif what == "rollback":
            step = min(step, n)
            g.rollback(step)
        elif what == "late":
            g.late([row(n, 0.5)])
        else:
            g.status(what, now)
    s = g.summary(now + 1.0)
    assert set(s["seconds"]) == set(BUCKETS)
    assert all(v >= 0 for v in s["seconds"].values())
    assert abs(sum(s["seconds"].values()) - s["wall"]) < 1e-6
    assert s["goodput"] is None or 0.0 <= s["goodput"] <= 1.0
    assert s["steps"] >= 0
