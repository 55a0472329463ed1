"""Each scheduling rule on a small cluster a reader can draw: priorities, gangs, quotas,
preemption, backfill, idle reclaim, admin changes (pure: no cluster, no clock)."""

from __future__ import annotations

import pytest

from clustersdk.control.scheduling import ClusterState, Holding, Scheduler, decide
from clustersdk.errors import SpecError

from .helpers import config, gpus, req, scheduler, started

SHARED = {"a": {"guaranteed": 4, "cohort": "lab"}, "b": {"guaranteed": 4, "cohort": "lab"}}


# order ---------------------------------------------------------------------------------
def test_higher_priority_starts_first_even_when_submitted_later():
    s = scheduler(gpus(1, 2), None, req("low", 2, "low"), req("high", 2, "high"))
    assert started(s.decide(0)) == {"high": 2}
    assert s.waits["low"].kind == "head"


def test_fifo_within_a_priority():
    s = scheduler(gpus(1, 2), None, req("first", 2), req("second", 2))
    assert started(s.decide(0)) == {"first": 2}


# gangs and backfill -------------------------------------------------------------------------
def test_a_gang_starts_whole_or_not_at_all_and_holds_the_free_slots_without_estimates():
    s = scheduler(gpus(1, 4), None, req("running", 1))
    s.decide(0)
    s.submit(req("big", 4))
    s.submit(req("small", 1))
    d = s.decide(1)
    assert d.start == []  # big can't have 4; small may not take slots big will need
    assert s.waits["big"].kind == "head" and "no estimate" in s.waits["big"].reason
    assert s.waits["small"].reason.startswith("waiting behind job 'big' (priority normal, 4 slots)")
    assert [len(r.slots) for r in d.reservations] == [3]


def test_backfill_with_time_limits_never_delays_the_head():
    s = scheduler(gpus(1, 8), None, req("running", 4, time_limit=100))
    s.decide(0)
    for r in (
        req("head", 8),
        req("short", 2, time_limit=50),
        req("long", 2, time_limit=500),
        req("unknown", 2),
    ):
        s.submit(r)
    d = s.decide(10)
    assert started(d) == {"short": 2}  # ends at 60, before the head's start at 100
    head = s.waits["head"]
    assert head.estimated_start == 100 and "expected when 'running' ends" in head.reason
    assert s.waits["long"].kind == s.waits["unknown"].kind == "behind"


def test_without_estimates_a_job_behind_the_head_takes_slots_the_head_cannot_use():
    # node0 busy until t=100; the head needs 6: at t=100 it gets node0 + 2 slots of node1
    s = scheduler(gpus(2, 4), None, req("busy", 4, time_limit=100))
    s.decide(0)
    s.submit(req("head", 6))
    s.submit(req("no-estimate", 2))
    d = s.decide(1)
    assert started(d) == {"no-estimate": 2}
    assert {slot.host for slot in d.start[0].slots} == {"h1"}
    assert s.waits["head"].estimated_start == 100


def test_the_head_starts_when_its_reserved_slots_free_up():
    s = scheduler(gpus(1, 4), None, req("a", 2), req("b", 2))
    s.decide(0)
    s.submit(req("big", 4))
    s.submit(req("small", 2))
    s.decide(1)
    s.released("a", 2)
    assert started(s.decide(2)) == {}  # a's slots go to big, not to small
    s.released("b", 3)
    assert started(s.decide(3)) == {"big": 4}


def test_elastic_job_starts_on_fewer_ranks_when_it_allows_it():
    s = scheduler(gpus(1, 4), None, req("busy", 1, preemptible=False))
    s.decide(0)
    s.submit(req("elastic", 4, min_world_size=2))
    assert started(s.decide(1)) == {"elastic": 3}


# preemption ----------------------------------------------------------------------------------
def _low_job_running(s: Scheduler, now: float = 0.0, **kw) -> None:
    s.submit(req("low", 4, "low", has_checkpoint_dir=True, **kw))
    assert started(s.decide(now)) == {"low": 4}


def test_high_priority_preempts_by_checkpoint_and_the_victim_comes_back_by_itself():
    s = scheduler(gpus(1, 4))
    _low_job_running(s)
    s.progress("low", 9, step=120)
    s.submit(req("high", 2, "high", owner="bob"))
    d = s.decide(10)
    assert [(p.job, p.how, p.for_job) for p in d.preempt] == [("low", "suspend", "high")]
    assert d.preempt[0].reason == (
        "preempted by job 'high' (priority high) at step 120, will resume when 4 slots are free"
    )
    assert d.start == [] and s.waits["high"].kind == "preempting"
    assert s.released("low", 11).id == "low"  # back in the queue, in its own place
    assert started(s.decide(11)) == {"high": 2}
    s.released("high", 50)
    assert started(s.decide(50)) == {"low": 4}


def test_a_job_without_checkpoint_dir_is_stopped_and_requeued():
    s = scheduler(gpus(1, 2), None, req("plain", 2, "low"))
    s.decide(0)
    s.submit(req("high", 2, "high"))
    d = s.decide(1)
    assert [(p.job, p.how) for p in d.preempt] == [("plain", "stop")]
    assert "no checkpoint_dir, so it starts over" in d.preempt[0].reason
    assert s.released("plain", 2) is not None and "plain" in s.queued


def test_victims_lose_the_least_work():
    s = scheduler(gpus(1, 4))
    for name in ("old-ckpt", "paused", "fresh-ckpt", "no-ckpt"):
        s.submit(req(name, 1, "low", has_checkpoint_dir=name != "no-ckpt"))
    s.decide(0)
    for name in ("old-ckpt", "paused", "fresh-ckpt", "no-ckpt"):
        s.progress(name, 99, step=10)
    s.checkpointed("old-ckpt", 10, step=1)
    s.checkpointed("fresh-ckpt", 95, step=9)
    s.paused("paused", 50)
    order = []
    for i in range(4):
        s.submit(req(f"high{i}", 1, "high"))
        order += [p.job for p in s.decide(100 + i).preempt]
    assert order == ["paused", "fresh-ckpt", "old-ckpt", "no-ckpt"]


def test_a_checkpoint_of_the_current_step_costs_nothing_and_goes_first():
    s = scheduler(gpus(1, 2))
    s.submit(req("big-state", 1, "low", has_checkpoint_dir=True))
    s.submit(req("saved", 1, "low", has_checkpoint_dir=True))
    s.decide(0)
    s.checkpointed("big-state", 5, state_bytes=10**12)
    s.progress("big-state", 9, step=3)
    s.checkpointed("saved", 9, step=3, state_bytes=10**12)
    s.progress("big-state", 10)
    s.progress("saved", 10)
    s.submit(req("high", 1, "high"))
    assert [p.job for p in s.decide(10).preempt] == ["saved"]


def test_never_preempts_a_non_preemptible_job_nor_preempts_in_vain():
    s = scheduler(gpus(1, 4), None, req("keep", 2, "high", preemptible=False), req("low", 2, "low"))
    s.decide(0)
    s.submit(req("urgent", 4, "high"))
    d = s.decide(1)  # preempting "low" alone would not make room for 4
    assert d.preempt == [] and s.waits["urgent"].kind == "head"


def test_only_the_victims_needed_are_preempted():
    s = scheduler(gpus(1, 4), None, req("one", 1, "low"), req("three", 3, "low"))
    s.decide(0)
    s.progress("one", 5)
    s.progress("three", 5)
    s.submit(req("high", 3, "high"))
    assert [p.job for p in s.decide(6).preempt] == ["three"]


def test_victims_slots_are_reserved_for_the_waiting_job_meanwhile():
    s = scheduler(gpus(1, 4), None, req("low", 2, "low", has_checkpoint_dir=True))
    s.decide(0)
    s.submit(req("high", 4, "high"))
    d = s.decide(1)
    assert [p.job for p in d.preempt] == ["low"] and len(d.reservations[0].slots) == 2
    s.submit(req("sneaky", 1, "high"))  # the same priority, submitted later: behind high
    assert started(s.decide(2)) == {}
    s.released("low", 3)
    assert started(s.decide(3)) == {"high": 4}


def test_the_slots_a_victim_leaves_go_to_the_job_it_left_for_not_to_a_head_ahead():
    slots = gpus(3, 2)  # h0, h1 busy until 100 and 200; the victim on h2
    s = scheduler(
        slots, None, req("r1", 2, "high", time_limit=100), req("r2", 2, "high", time_limit=200)
    )
    s.decide(0)
    s.submit(req("victim", 2, "low", has_checkpoint_dir=True, time_limit=1000))
    s.decide(0)
    s.submit(req("head", 4, "high"))  # the victim alone is not enough for it: it waits
    s.submit(req("small", 2, "high"))  # behind it; the victim's slots are not in its plan
    d = s.decide(1)
    assert [(p.job, p.for_job) for p in d.preempt] == [("victim", "small")]
    assert s.waits["head"].estimated_start == 200
    s.released("victim", 2)  # its slots now look good to the head too: they are owed
    assert started(s.decide(2)) == {"small": 2} and s.waits["head"].estimated_start == 200


def test_a_victim_that_outlives_the_grace_is_stopped():
    s = scheduler(
        gpus(1, 2), config(preemption_grace=30), req("low", 2, "low", has_checkpoint_dir=True)
    )
    s.decide(0)
    s.submit(req("high", 2, "high"))
    s.decide(10)
    assert s.decide(39).preempt == []
    late = s.decide(41).preempt
    assert [(p.job, p.how, p.overdue) for p in late] == [("low", "stop", True)]
    assert "30 s preemption grace" in late[0].reason


def test_a_preempted_job_keeps_its_place_ahead_of_later_submissions():
    s = scheduler(gpus(1, 2), None, req("victim", 2, "normal", has_checkpoint_dir=True))
    s.decide(0)
    s.submit(req("high", 2, "high"))
    s.decide(1)
    s.submit(req("later", 2, "normal"))
    s.released("victim", 2)
    s.decide(2)
    s.released("high", 3)
    assert started(s.decide(3)) == {"victim": 2}


# quotas ---------------------------------------------------------------------------------------
def test_a_queue_stops_at_its_guarantee_plus_borrowing_limit():
    cfg = config(queues={"q": {"guaranteed": 2, "borrowing-limit": 1}})
    s = scheduler(gpus(1, 8), cfg, req("a", 2, queue="q"), req("b", 2, queue="q"), req("other", 2))
    assert started(s.decide(0)) == {"a": 2, "other": 2}  # a limit-held job holds nothing back
    assert s.waits["b"].reason == (
        "waiting: queue 'q' is at its limit of 3 slots (2 guaranteed "
        "+ 1 borrowing); it needs 2 slots"
    )


def test_a_lender_reclaims_its_guarantee_from_a_borrower_of_higher_priority():
    s = scheduler(
        gpus(1, 8),
        config(queues=SHARED),
        req("b1", 4, "high", queue="b", owner="bob", preemptible=False),
        req("b2", 4, "high", queue="b", owner="bob", has_checkpoint_dir=True),
    )
    assert started(s.decide(0)) == {"b1": 4, "b2": 4}  # b2 borrows a's idle guarantee
    s.submit(req("a1", 4, "low", queue="a"))
    d = s.decide(1)
    assert [(p.job, p.how, p.for_job) for p in d.preempt] == [("b2", "suspend", "a1")]
    s.released("b2", 2)
    assert started(s.decide(2)) == {"a1": 4}  # guarantees first: b2 (high) does not take it back
    assert s.waits["b2"].kind == "head"


def test_a_borrower_does_not_preempt_a_queue_within_its_guarantee():
    s = scheduler(gpus(1, 8), config(queues=SHARED), req("a1", 4, "low", queue="a"))
    s.decide(0)
    s.submit(req("b-big", 8, "high", queue="b", owner="bob"))
    assert s.decide(1).preempt == []


def test_idle_guarantees_are_lent_only_within_a_cohort():
    apart = {"a": {"guaranteed": 4, "cohort": "x"}, "b": {"guaranteed": 4, "cohort": "y"}}
    s = scheduler(gpus(1, 8), config(queues=apart), req("a-big", 6, queue="a"))
    assert started(s.decide(0)) == {}
    assert s.waits["a-big"].reason == (
        "waiting: free slots are held for the guarantees of queues outside cohort 'x', which do "
        "not lend to queue 'a'; it needs 6 slots"
    )
    s = scheduler(gpus(1, 8), config(queues=SHARED), req("a-big", 6, queue="a"))
    assert started(s.decide(0)) == {"a-big": 6}


def test_the_per_user_cap_holds_and_holds_nobody_else_back():
    s = scheduler(
        gpus(1, 8),
        config(per_user_cap=4),
        req("mine", 4),
        req("mine-too", 2),
        req("bobs", 2, owner="bob"),
    )
    assert started(s.decide(0)) == {"mine": 4, "bobs": 2}
    assert "user 'alice' is at the per-user cap of 4 slots" in s.waits["mine-too"].reason


def test_an_owner_preempts_its_own_lower_priority_job_to_stay_under_the_cap():
    s = scheduler(gpus(1, 8), config(per_user_cap=4), req("mine-low", 4, "low"))
    s.decide(0)
    s.submit(req("mine-high", 4, "high"))
    assert [p.job for p in s.decide(1).preempt] == ["mine-low"]


def test_a_non_preemptible_job_does_not_borrow():
    s = scheduler(
        gpus(1, 8), config(queues=SHARED), req("firm", 6, "high", queue="a", preemptible=False)
    )
    s.decide(0)
    assert (
        "it cannot be preempted, so it may not borrow: the jobs of queue 'a' that cannot be "
        "preempted may hold at most its 4 guaranteed slots"
    ) in s.waits["firm"].reason


def test_a_non_preemptible_job_fits_the_guarantee_while_preemptible_ones_borrow():
    s = scheduler(
        gpus(1, 4),
        config(queues={"default": {"guaranteed": 2}}),
        req("borrower", 3, "low"),
        req("firm", 1, preemptible=False),
    )
    assert started(s.decide(0)) == {"borrower": 3, "firm": 1}  # no victim needed
    s.submit(req("firm-too", 2, preemptible=False))
    s.decide(1)
    assert s.waits["firm-too"].kind == "limit"  # 1 + 2 firm slots would pass the guarantee


def test_a_guarantee_comes_before_a_higher_priority_borrower():
    s = scheduler(gpus(1, 8), config(queues=SHARED), req("a-busy", 4, "high", queue="a"))
    s.decide(0)
    s.submit(req("a-borrow", 4, "high", queue="a"))  # would borrow: goes second
    s.submit(req("b-high", 4, "high", queue="b", owner="bob"))  # fits b's guarantee: first
    s.submit(req("b-low", 4, "low", queue="b", owner="bob"))
    assert started(s.decide(1)) == {"b-high": 4}
    assert s.waits["a-borrow"].kind == "head" and s.waits["b-low"].kind == "head"


def test_a_borrower_does_not_preempt_its_owners_job_that_fits_a_guarantee():
    # it would come back first (guarantees before borrowing) and take its slots again
    cfg = config(queues={"prod": {"guaranteed": 2}, "batch": {"guaranteed": 0}})
    s = scheduler(gpus(1, 2), cfg, req("mine", 2, "low", queue="prod", has_checkpoint_dir=True))
    s.decide(0)
    s.submit(req("my-batch", 2, "high", queue="batch"))
    assert s.decide(1).preempt == []
    s.submit(req("my-prod", 2, "high", queue="prod"))
    assert [p.job for p in s.decide(2).preempt] == ["mine"]


# idle reclaim ----------------------------------------------------------------------------------
def test_idle_jobs_are_reclaimed_after_the_queue_idle_timeout_and_stay_suspended():
    cfg = config(queues={"default": {"idle-timeout": 60}})
    s = scheduler(
        gpus(1, 4),
        cfg,
        req("paused", 1, has_checkpoint_dir=True),
        req("stuck", 1, has_checkpoint_dir=True),
        req("plain", 1),
        req("firm", 1, preemptible=False),
    )
    s.decide(0)
    for job in ("stuck", "plain", "firm"):
        s.progress(job, 10, step=1)
    s.paused("paused", 20)
    assert s.decide(70).reclaim == []
    reclaimed = {p.job: p.how for p in s.decide(81).reclaim}
    assert reclaimed == {"paused": "suspend", "stuck": "suspend", "plain": "stop"}
    assert s.released("paused", 82) is None and "paused" not in s.queued  # job.resume() brings it


def test_idle_timeout_is_off_by_default():
    s = scheduler(gpus(1, 1), None, req("idle", 1))
    s.decide(0)
    s.paused("idle", 1)
    assert s.decide(10**6).reclaim == []


# admin changes and pure decide --------------------------------------------------------------
def test_lowering_a_quota_stops_nothing_but_holds_new_jobs():
    s = scheduler(
        gpus(1, 8),
        config(queues={"q": {"guaranteed": 8, "borrowing-limit": 0}}),
        req("running", 6, queue="q"),
    )
    s.decide(0)
    s.configure({"queues": {"q": {"guaranteed": 2}}})
    s.submit(req("new", 1, queue="q"))
    d = s.decide(1)
    assert d.start == d.preempt == d.reclaim == [] and "running" in s.holdings
    assert "at its limit of 2 slots" in s.waits["new"].reason


def test_a_queue_with_jobs_cannot_be_removed():
    s = scheduler(gpus(1, 2), config(queues={"q": {"guaranteed": 1}}), req("j", 1, queue="q"))
    with pytest.raises(SpecError, match="queue\\(s\\) 'q' still have jobs"):
        s.configure({"queues": {"q": None}})


def test_decide_from_a_whole_state_matches_the_scheduler():
    s = scheduler(gpus(2, 4), None, req("a", 4, "low", has_checkpoint_dir=True))
    s.decide(0)
    for r in (req("b", 6, "high"), req("c", 2), req("d", 1, time_limit=5)):
        s.submit(r)
    state = s.state()
    pure = decide(state, now=3)
    kept = Scheduler.from_state(state).decide(3)
    assert (pure.start, pure.preempt, pure.reservations) == (
        kept.start,
        kept.preempt,
        kept.reservations,
    )
    assert dict(pure.waiting) == dict(kept.waiting) and set(pure.waiting) == {"b"}
    # b preempts a and holds 2 free slots; c takes the 2 it can't use; d (5 s) backfills
    assert [p.job for p in pure.preempt] == ["a"] and started(pure) == {"c": 2, "d": 1}
    assert isinstance(state.holdings[0], Holding) and isinstance(state, ClusterState)


def test_a_lost_worker_is_reported_with_the_job_that_held_it():
    slots = gpus(1, 2)
    s = scheduler(slots, None, req("j", 2))
    s.decide(0)
    assert s.remove_slot(slots[1].worker) == "j"
    s.released("j", 1, requeue=True)
    assert started(s.decide(1)) == {} and s.waits["j"].kind == "limit"
