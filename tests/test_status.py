"""The job lifecycle table, checked pair by pair against an explicit list."""

from __future__ import annotations

import itertools
import re

import pytest

from clustersdk.errors import InvalidTransitionError
from clustersdk.status import TERMINAL, TRANSITIONS, JobStatus, check_transition

Q, S, R, G, F, X, D = (
    JobStatus.QUEUED,
    JobStatus.STARTING,
    JobStatus.RUNNING,
    JobStatus.STOPPING,
    JobStatus.FINISHED,
    JobStatus.FAILED,
    JobStatus.STOPPED,
)
P, U, Z = JobStatus.PAUSED, JobStatus.SUSPENDING, JobStatus.SUSPENDED
T = JobStatus.RESTARTING
H = JobStatus.HUNG
L = JobStatus.HELD

ALLOWED = {
    (Q, S),
    (Q, D),
    (Q, X),
    (Q, Z),  # suspended while queued: held out of the queue
    (S, R),
    (S, G),
    (S, X),
    (S, F),
    (S, T),
    (S, U),  # suspended before its first step: it checkpoints there
    (R, P),
    (R, U),
    (R, G),
    (R, F),
    (R, X),
    (R, T),
    (R, H),
    (H, R),
    (H, T),
    (H, G),
    (H, F),
    (H, X),
    (P, R),
    (P, U),
    (P, G),
    (P, X),
    (P, T),
    (P, F),  # its ranks ended while it was paused (e.g. their worker closed)
    (T, Q),
    (T, G),
    (T, X),
    (U, Z),
    (U, G),
    (U, F),
    (U, X),
    (U, Q),  # a preempted job queues again
    (Z, Q),
    (Z, D),
    (G, D),
    (G, X),
    (G, F),
    (G, Q),
    (S, L),
    (R, L),
    (P, L),
    (H, L),  # a rank raised under on_error="hold"
    (L, G),
    (L, T),
    (L, X),  # stop (then FAILED), restart_from_checkpoint, hold_timeout
}

PAIRS = list(itertools.product(JobStatus, repeat=2))


def test_the_table_covers_every_state():
    assert set(TRANSITIONS) == set(JobStatus)


def test_terminal_states_have_no_exits():
    assert TERMINAL == {F, X, D}
    assert {s for s in JobStatus if s.terminal} == TERMINAL
    assert all(not TRANSITIONS[s] for s in TERMINAL)


@pytest.mark.parametrize("current, new", PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_check_transition(current, new):
    if (current, new) in ALLOWED:
        check_transition("train-1", current, new)
    else:
        with pytest.raises(
            InvalidTransitionError, match=re.escape(f"job 'train-1' is {current.name}")
        ):
            check_transition("train-1", current, new)


def test_the_error_says_what_is_allowed_instead():
    with pytest.raises(
        InvalidTransitionError, match=r"allowed from FINISHED: nothing \(terminal\)"
    ):
        check_transition("j", F, R)
    with pytest.raises(
        InvalidTransitionError, match="allowed from QUEUED: FAILED, STARTING, STOPPED, SUSPENDED"
    ):
        check_transition("j", Q, R)


def test_status_prints_as_its_name_and_round_trips_by_value():
    assert str(JobStatus.RUNNING) == "RUNNING"
    assert JobStatus("running") is JobStatus.RUNNING
