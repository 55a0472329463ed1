"""job.run and job.update in the control plane, with no cluster: the book, the checks,
the sequence numbers across restarts and resumes."""

from __future__ import annotations

import pytest

from clustersdk import hparams
from clustersdk.control import events as ev
from clustersdk.control.lifecycle import Lifecycle
from clustersdk.errors import InvalidTransitionError, SpecError
from clustersdk.protocol import ExitStatus, WireSpec, Word
from clustersdk.status import JobStatus

S = JobStatus
SGD = {"type": "SGD", "groups": [{"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0}]}
ADAMW2 = {
    "type": "AdamW",
    "groups": [
        {"lr": 0.01, "betas": [0.9, 0.999], "weight_decay": 0.01},
        {"lr": 0.02, "betas": [0.9, 0.999], "weight_decay": 0.0},
    ],
}


def info(optimizer=ADAMW2, batch=16, calls=("micro_batches", "optimizer_step")):
    return {"optimizers": {"optimizer": optimizer}, "batch": batch, "calls": list(calls)}


def running(world_size=2, **options) -> Lifecycle:
    job = Lifecycle(
        WireSpec(id="j1", name="j", world_size=world_size, **options), failure_grace=3.0
    )
    job.handle(
        ev.Allocated(tuple(ev.RankSlot(f"w{i}", f"h{i}", "cpu") for i in range(world_size))), 0.0
    )
    for rank in range(world_size):
        job.handle(ev.Started(rank, job.attempt), 1.0)
    return job


def tell(job, **kw) -> None:
    for rank in range(job.world_size):
        job.handle(ev.Tunable(rank, job.attempt, info(**kw)), 1.5)


def sent(actions) -> list[tuple[int, ...]]:
    return [a.words for a in actions if isinstance(a, ev.SendControl)]


def records(actions) -> list[ev.Record]:
    return [a for a in actions if isinstance(a, ev.Record)]


# --- job.run ---------------------------------------------------------------------------------
def test_a_run_reaches_the_chosen_ranks_through_the_run_word_and_completes_with_them():
    job = running(3)
    words = sent(job.handle(ev.RunRequested(b"fn", (0, 2), 1000), 2.0))
    assert [w[Word.RUN] for w in words] == [1]
    book = job.live
    # ranks ask with the agreed word: a rank that was not chosen gets nothing
    assert book.pending(0, 1, runs=(0, 1), updates=(0, 0)) == []
    assert [e["fn"] for e in book.pending(0, 0, runs=(0, 1), updates=(0, 0))] == [b"fn"]
    assert [e["fn"] for e in book.pending(0, 2, runs=(0, 1), updates=(0, 0))] == [b"fn"]
    assert book.runs[1]["fn"] is None  # every chosen rank has it: not kept
    job.handle(ev.Ran(0, 0, 1, result=b"r0"), 2.1)
    assert not book.runs[1]["complete"]
    job.handle(ev.Ran(2, 0, 1, error={"type": "ValueError", "message": "no"}), 2.2)
    assert book.runs[1]["complete"] and book.runs[1]["results"] == {0: b"r0"}
    assert book.runs[1]["errors"][2]["type"] == "ValueError"
    assert job.status is S.RUNNING  # a failing function is no failure of the job


def test_a_rank_asks_only_up_to_the_agreed_word_so_every_rank_gets_the_same_list():
    job = running(2)
    job.handle(ev.RunRequested(b"a", None, 1000), 2.0)
    first = job.live.pending(0, 0, runs=(0, 1), updates=(0, 0))
    job.handle(ev.RunRequested(b"b", None, 1000), 2.1)  # arrives between the two ranks' asks
    second = job.live.pending(0, 1, runs=(0, 1), updates=(0, 0))
    assert [e["seq"] for e in first] == [e["seq"] for e in second] == [1]
    assert [e["fn"] for e in job.live.pending(0, 1, runs=(1, 2), updates=(0, 0))] == [b"b"]


@pytest.mark.parametrize("ranks", [(2,), (-1,), (0, 0), (), (True,)])
def test_a_run_on_ranks_the_job_does_not_have_is_refused_before_anything(ranks):
    job = running(2)
    with pytest.raises(SpecError, match=r"name distinct ranks from 0 to 1 \(job 'j' has 2\)"):
        job.handle(ev.RunRequested(b"fn", ranks, 1000), 2.0)
    assert job.live.seq == 0 and job.words[Word.RUN] == 0


def test_run_and_update_need_a_job_that_runs_or_will():
    job = Lifecycle(
        WireSpec(id="j1", name="j", world_size=1, checkpoint_dir="/c"), failure_grace=3.0
    )
    job.handle(ev.SuspendRequested(), 0.0)  # QUEUED: held out of the queue
    assert job.status is S.SUSPENDED
    with pytest.raises(
        InvalidTransitionError,
        match=r"is SUSPENDED; job.run needs a RUNNING, PAUSED or HELD job, or one not started yet \(QUEUED or STARTING\)",
    ):
        job.handle(ev.RunRequested(b"fn", None, 1000), 0.0)
    with pytest.raises(
        InvalidTransitionError,
        match=r"is SUSPENDED; job.update needs a RUNNING or PAUSED job, or one not started",
    ):
        job.handle(ev.UpdateRequested({"lr": 0.1}), 0.0)


def test_a_new_gang_closes_the_runs_of_the_old_one_and_never_runs_them():
    job = running(2, checkpoint_dir="/c", max_restarts=1)
    job.handle(ev.RunRequested(b"fn", None, 1000), 2.0)
    job.handle(ev.Ran(0, 0, 1, result=b"r0"), 2.1)
    job.handle(ev.WorkerLost(1, 0, "w1", "h1"), 3.0)
    job.handle(ev.Exited(0, 0, ExitStatus.STOPPED), 3.1)
    assert job.status is S.QUEUED and job.attempt == 1
    job.handle(ev.Allocated((ev.RankSlot("w0", "h0", "cpu"), ev.RankSlot("w2", "h2", "cpu"))), 4)
    entry = job.live.runs[1]
    assert entry["complete"] and entry["results"] == {0: b"r0"}
    assert entry["errors"][1]["type"] == "GangEnded"
    assert job.live.pending(1, 1, runs=(0, 1), updates=(0, 0)) == []


def test_old_run_results_are_let_go_but_not_a_run_a_rank_has_still_to_carry_out():
    job = running(1)
    job.handle(ev.RunRequested(b"slow", None, 1000), 2.0)  # its rank is busy elsewhere
    for seq in range(2, 22):
        job.handle(ev.RunRequested(b"fn", None, 1000), 2.0)
        job.handle(ev.Ran(0, 0, seq, result=b"r"), 2.0)
    assert sorted(job.live.runs) == [1, *range(6, 22)]  # the newest 16, and the slow one
    assert [e["fn"] for e in job.live.pending(0, 0, runs=(0, 1), updates=(0, 0))] == [b"slow"]


# --- job.update: the checks --------------------------------------------------------------------
SPEC = WireSpec(
    id="j",
    name="j",
    world_size=2,
    checkpoint_dir="/c",
    hparams={"warmup": 10, "smoothing": 0.1, "schedule": "cosine", "ema": False},
)
RANKS = {0: info(), 1: info()}


@pytest.mark.parametrize(
    "changes, normal",
    [
        ({"lr": 1e-3}, {"lr": 1e-3}),
        ({"lr": 0}, {"lr": 0.0}),
        ({"lr": {0: 1e-3, "1": 2e-3}}, {"lr[0]": 1e-3, "lr[1]": 2e-3}),
        ({"betas": (0.8, 0.95)}, {"betas": [0.8, 0.95]}),
        ({"weight_decay": {1: 0.1}}, {"weight_decay[1]": 0.1}),
        ({"clip_grad_norm": 1}, {"clip_grad_norm": 1.0}),
        ({"clip_grad_norm": None}, {"clip_grad_norm": None}),
        ({"grad_accum": 4}, {"grad_accum": 4}),
        ({"checkpoint_every": 50}, {"checkpoint_every": 50}),
        ({"metrics_interval": 1}, {"metrics_interval": 1.0}),
        (
            {"warmup": 20, "smoothing": 0, "schedule": "linear", "ema": True},
            {"warmup": 20, "smoothing": 0.0, "schedule": "linear", "ema": True},
        ),
    ],
)
def test_good_changes_are_normalized(changes, normal):
    assert hparams.check(changes, SPEC, RANKS) == normal


@pytest.mark.parametrize(
    "changes, message",
    [
        ({}, r"needs at least one change"),
        (
            {"momentum": 0.5},
            r"job.update\(momentum=...\): unknown key; it changes lr, weight_decay, "
            r"betas, .* and the job's hparams \(ema, schedule, smoothing, warmup\)",
        ),
        ({"lr": -1e-3}, r"job.update\(lr=-0.001\): lr must be a finite number >= 0"),
        ({"lr": float("nan")}, r"lr must be a finite number"),
        ({"lr": "fast"}, r"job.update\(lr='fast'\): lr must be a finite number >= 0"),
        ({"lr": True}, r"lr must be a finite number"),
        (
            {"lr": {2: 1e-3}},
            r"group 2 does not exist; optimizer 'optimizer' \(AdamW\) has 2 param "
            r"group\(s\), 0 to 1",
        ),
        ({"lr": {"x": 1e-3}}, r"'x' is not a param group index"),
        ({"betas": 0.9}, r"betas must be two numbers in \[0, 1\)"),
        ({"betas": (0.9, 1.0)}, r"betas must be two numbers in \[0, 1\)"),
        ({"clip_grad_norm": 0}, r"clip_grad_norm must be a finite number > 0"),
        ({"grad_accum": 0}, r"grad_accum must be a positive int"),
        ({"grad_accum": 2.0}, r"grad_accum must be a positive int"),
        ({"grad_accum": 3}, r"grad_accum must divide the batch of each rank, and rank 0's is 16"),
        ({"checkpoint_every": -5}, r"checkpoint_every must be a positive int"),
        ({"metrics_interval": 0}, r"metrics_interval must be a finite number > 0"),
        (
            {"warmup": 2.5},
            r"job.update\(warmup=2.5\): ctx.hparams\['warmup'\] is a int \(launched "
            r"as 10\); give a int",
        ),
        ({"warmup": True}, r"ctx.hparams\['warmup'\] is a int"),
        ({"smoothing": "0.1"}, r"ctx.hparams\['smoothing'\] is a float"),
        ({"ema": 1}, r"ctx.hparams\['ema'\] is a bool"),
    ],
)
def test_bad_changes_name_the_key_and_what_it_takes(changes, message):
    with pytest.raises(SpecError, match=message):
        hparams.check(changes, SPEC, RANKS)


def test_what_the_ranks_hold_decides_what_can_change():
    sgd = {0: info(SGD), 1: info(SGD)}
    with pytest.raises(
        SpecError,
        match=r"optimizer 'optimizer' \(SGD\) has no 'betas' in param "
        r"group 0; it has lr, momentum, weight_decay",
    ):
        hparams.check({"betas": (0.9, 0.99)}, SPEC, sgd)
    with pytest.raises(SpecError, match="registered no optimizer; call ctx.register"):
        hparams.check({"lr": 0.1}, SPEC, {0: {"optimizers": {}, "calls": []}})
    with pytest.raises(SpecError, match="report their optimizers after their first step"):
        hparams.check({"lr": 0.1}, SPEC, {})
    plain = {0: info(calls=()), 1: info(calls=())}
    with pytest.raises(SpecError, match="through ctx.optimizer_step or ctx.train_step"):
        hparams.check({"clip_grad_norm": 1.0}, SPEC, plain)
    with pytest.raises(SpecError, match="through ctx.micro_batches or ctx.train_step"):
        hparams.check({"grad_accum": 2}, SPEC, plain)
    assert hparams.check({"grad_accum": 1}, SPEC, plain) == {"grad_accum": 1}


def test_what_the_spec_says_decides_too():
    pp = SPEC.replace(strategy="pp")
    with pytest.raises(
        SpecError,
        match=r"under strategy='pp' the pipeline schedule cuts each "
        "batch",
    ):
        hparams.check({"grad_accum": 2}, pp, RANKS)
    with pytest.raises(SpecError, match="the job has no checkpoint_dir"):
        hparams.check({"checkpoint_every": 5}, SPEC.replace(checkpoint_dir=None), RANKS)
    with pytest.raises(SpecError, match=r"hparams \(none: launch\(hparams=\{...\}\) names them\)"):
        hparams.check({"warmup": 5}, SPEC.replace(hparams=None), RANKS)


def test_a_refused_update_changes_nothing_in_the_job():
    job = running(2)
    tell(job)
    words = list(job.words)
    with pytest.raises(SpecError):
        job.handle(ev.UpdateRequested({"lr": -1.0}), 2.0)
    assert job.live.seq == 0 and list(job.words) == words and job.status is S.RUNNING


def test_merged_changes_keep_the_newest_value_of_each_key():
    net = hparams.merge({}, {"lr[0]": 0.1, "lr[1]": 0.2, "warmup": 5})
    net = hparams.merge(net, {"lr[1]": 0.3})
    assert net == {"lr[0]": 0.1, "lr[1]": 0.3, "warmup": 5}
    assert hparams.merge(net, {"lr": 0.5}) == {"warmup": 5, "lr": 0.5}


# --- job.update: applied, recorded, carried across gangs -----------------------------------------
def test_an_update_is_applied_by_every_rank_and_recorded_once():
    job = running(2, checkpoint_dir="/c", hparams={"warmup": 10})
    tell(job)
    words = sent(
        job.handle(ev.UpdateRequested({"lr": 1e-3, "warmup": 20, "checkpoint_every": 7}), 2.0)
    )
    assert [w[Word.UPDATE] for w in words] == [1]
    [entry] = job.live.pending(0, 1, runs=(0, 0), updates=(0, 1))
    assert entry["changes"] == {"lr": 1e-3, "warmup": 20, "checkpoint_every": 7}
    changes = {"lr": [0.01, 1e-3], "warmup": [10, 20], "checkpoint_every": [None, 7]}
    actions = job.handle(ev.Updated(1, 0, 1, 12, changes), 2.1)
    [record] = records(actions)
    assert record.kind == "updated" and record.data == {"seq": 1, "step": 12, "changes": changes}
    assert (
        record.message == "lr 0.01 → 0.001, warmup 10 → 20, checkpoint_every None → 7 "
        "(before step 12)"
    )
    publish = [a.message for a in actions if isinstance(a, ev.Publish)]
    assert publish == [{"kind": "updated", "seq": 1, "step": 12, "changes": changes}]
    assert job.spec.checkpoint_every == 7  # later gangs start with it
    assert any("spec" in a.fields for a in actions if isinstance(a, ev.Journal))
    assert not job.live.done(1, 2)
    assert records(job.handle(ev.Updated(0, 0, 1, 12, changes), 2.2)) == []
    assert job.live.done(1, 2)


def test_a_rank_that_refuses_an_update_makes_it_refused_with_its_reason():
    job = running(2)
    tell(job)
    job.handle(ev.UpdateRequested({"lr": 1e-3}), 2.0)
    job.handle(
        ev.Updated(
            0,
            0,
            1,
            error={"rank": 0, "type": "Refused", "message": "another rank refused the update"},
        ),
        2.1,
    )
    job.handle(
        ev.Updated(
            1,
            0,
            1,
            error={
                "rank": 1,
                "type": "SpecError",
                "cause": True,
                "message": "no 'lr' in param group 0",
            },
        ),
        2.2,
    )
    entry = job.live.updates[1]
    assert entry["error"]["rank"] == 1 and entry["step"] is None and job.live.done(1, 2)
    assert job.live.pending(0, 0, runs=(0, 0), updates=(0, 1)) == []


def test_a_new_gang_gets_every_change_so_far_once_and_no_old_run():
    job = running(2, checkpoint_dir="/c", hparams={"warmup": 10})
    tell(job)
    job.handle(ev.UpdateRequested({"lr": {1: 0.5}, "warmup": 20}), 2.0)
    job.handle(ev.Updated(0, 0, 1, 5, {"lr[1]": [0.02, 0.5], "warmup": [10, 20]}), 2.1)
    job.handle(ev.Updated(1, 0, 1, 5, {"lr[1]": [0.02, 0.5], "warmup": [10, 20]}), 2.1)
    job.handle(ev.RunRequested(b"fn", None, 1000), 2.2)
    job.handle(ev.UpdateRequested({"lr": 0.1}), 2.3)  # asked, not applied before the suspend
    job.handle(ev.SuspendRequested(), 3.0)
    for rank in (0, 1):
        job.handle(ev.Exited(rank, 0, ExitStatus.SUSPENDED), 3.1)
    assert job.status is S.SUSPENDED
    with pytest.raises(InvalidTransitionError, match="SUSPENDED; job.update needs"):
        job.handle(ev.UpdateRequested({"lr": 0.2}), 3.5)
    job.handle(ev.ResumeRequested(world_size=1), 4.0)
    actions = job.handle(ev.Allocated((ev.RankSlot("w0", "h0", "cpu"),)), 5.0)
    [start] = [a for a in actions if isinstance(a, ev.StartGang)]
    assert start.words[Word.UPDATE] == 3 and start.words[Word.RUN] == 0
    # the new gang's rank asks with the words it starts with: one carried update, no run
    [carried] = job.live.pending(
        1, 0, runs=(0, start.words[Word.RUN]), updates=(0, start.words[Word.UPDATE])
    )
    assert carried == {
        "seq": 3,
        "kind": "update",
        "carried": True,
        "changes": {"warmup": 20, "lr": 0.1},
    }
    assert job.live.runs[2]["errors"][0]["type"] == "GangEnded"
    assert job.live.info == {}  # the new gang reports its batch again
    # its report records only the change never applied before
    actions = job.handle(ev.Updated(0, 1, 3, 0, {"lr": [0.01, 0.1]}), 5.1)
    assert [r.data["seq"] for r in records(actions)] == [3]
    assert job.live.updates[1]["step"] == 5 and job.live.updates[3]["step"] == 0
    # a newer request is asked beyond the carried word, and never replays it
    job.handle(ev.Started(0, 1), 5.2)
    tell(job)
    job.handle(ev.UpdateRequested({"warmup": 30}), 6.0)
    assert [e["seq"] for e in job.live.pending(1, 0, runs=(0, 0), updates=(3, 4))] == [4]


def test_a_gang_with_nothing_to_carry_starts_with_no_update_word():
    job = running(2, checkpoint_dir="/c", max_restarts=1)
    tell(job)
    with pytest.raises(SpecError):
        job.handle(ev.UpdateRequested({"lr": -1}), 2.0)
    job.handle(ev.WorkerLost(1, 0, "w1", "h1"), 3.0)
    job.handle(ev.Exited(0, 0, ExitStatus.STOPPED), 3.1)
    actions = job.handle(
        ev.Allocated((ev.RankSlot("w0", "h0", "cpu"), ev.RankSlot("w2", "h2", "cpu"))), 4.0
    )
    [start] = [a for a in actions if isinstance(a, ev.StartGang)]
    assert start.words[Word.UPDATE] == 0 and job.live.carry is None


def test_reports_of_an_earlier_gang_are_ignored():
    job = running(2, checkpoint_dir="/c", max_restarts=1)
    tell(job)
    job.handle(ev.UpdateRequested({"lr": 1e-3}), 2.0)
    job.handle(ev.WorkerLost(1, 0, "w1", "h1"), 3.0)
    job.handle(ev.Exited(0, 0, ExitStatus.STOPPED), 3.1)
    job.handle(ev.Allocated((ev.RankSlot("w0", "h0", "cpu"), ev.RankSlot("w2", "h2", "cpu"))), 4.0)
    assert job.handle(ev.Updated(0, 0, 1, 9, {"lr": [0.01, 1e-3]}), 4.1) == []
    assert job.live.updates[1]["step"] is None


# --- asked before the first step boundary ---------------------------------------------------
def queued(world_size=2, **options) -> Lifecycle:
    return Lifecycle(
        WireSpec(id="j1", name="j", world_size=world_size, **options), failure_grace=3.0
    )


def start(job: Lifecycle, world_size: int = 2) -> ev.StartGang:
    slots = tuple(ev.RankSlot(f"w{i}", f"h{i}", "cpu") for i in range(world_size))
    (action,) = [a for a in job.handle(ev.Allocated(slots), 1.0) if isinstance(a, ev.StartGang)]
    return action


def test_a_queued_jobs_update_is_checked_as_far_as_its_spec_allows_and_goes_with_its_gang():
    job = queued(hparams={"warmup": 10})
    with pytest.raises(SpecError, match="lr must be a finite number"):
        job.handle(ev.UpdateRequested({"lr": -1}), 0.0)
    with pytest.raises(SpecError, match=r"ctx.hparams\['warmup'\] is a int"):
        job.handle(ev.UpdateRequested({"warmup": 2.5}), 0.0)
    job.handle(ev.UpdateRequested({"lr": 0.01, "grad_accum": 2}), 0.0)  # the ranks check the rest
    assert job.pending == [{"op": "update", "seq": 1, "changes": {"lr": 0.01, "grad_accum": 2}}]
    assert start(job).words[Word.UPDATE] == 1
    # once, as the gang's carried update: not a second time as the request itself
    assert job.live.pending(0, 1, runs=(0, 0), updates=(0, 1)) == [
        {"seq": 1, "kind": "update", "changes": {"lr": 0.01, "grad_accum": 2}, "carried": True}
    ]
    job.handle(ev.Updated(0, 0, 1, step=0, changes={"lr": [0.1, 0.01]}), 2.0)
    job.handle(ev.Updated(1, 0, 1, step=0, changes={"lr": [0.1, 0.01]}), 2.0)
    assert job.live.done(1, 2) and job.pending == []


def test_a_rank_that_refuses_an_early_update_says_why_in_a_durable_event():
    job = queued()
    job.handle(ev.UpdateRequested({"betas": (0.8, 0.9)}), 0.0)
    start(job)
    error = {
        "rank": 0,
        "type": "SpecError",
        "message": "no 'betas' in param group 0",
        "cause": True,
    }
    actions = job.handle(ev.Updated(0, 0, 1, step=0, error=error), 2.0)
    (record,) = [a for a in actions if isinstance(a, ev.Record)]
    assert record.kind == "update_refused" and "no 'betas'" in record.message
    assert job.pending == []  # refused: nothing waits any more


def test_a_queued_jobs_run_goes_with_its_gang_and_one_no_rank_took_survives_a_restart():
    job = queued(max_restarts=1)
    job.handle(ev.RunRequested(b"early", None, 1000), 0.0)
    assert job.pending == [{"op": "run", "seq": 1, "ranks": [0, 1]}]
    assert start(job).words[Word.RUN] == 1
    assert [e["fn"] for e in job.live.pending(0, 0, runs=(0, 1), updates=(0, 0))] == [b"early"]
    job.handle(ev.RunRequested(b"late", None, 1000), 2.0)  # no rank took it yet ...
    job.handle(ev.WorkerLost(1, 0, "w1", "h1"), 3.0)
    job.handle(ev.Exited(0, 0, ExitStatus.STOPPED), 3.1)
    assert start(job).words[Word.RUN] == 2  # ... the next gang runs it, at its first boundary
    assert [e["fn"] for e in job.live.pending(1, 1, runs=(0, 2), updates=(0, 0))] == [b"late"]
    assert job.live.runs[1]["errors"][1]["type"] == "GangEnded"  # rank 0 had taken this one


def test_a_run_for_a_rank_a_smaller_gang_lacks_is_closed_saying_so():
    job = queued(min_world_size=1)
    job.handle(ev.RunRequested(b"fn", [1], 1000), 0.0)
    start(job, world_size=1)
    assert job.live.pending(0, 0, runs=(0, 1), updates=(0, 0)) == [] and job.pending == []
    assert "started on 1 rank(s): it has no rank 1" in job.live.runs[1]["errors"][1]["message"]
