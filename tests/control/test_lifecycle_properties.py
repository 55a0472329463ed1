"""Properties of the job lifecycle under any sequence of events (hypothesis).

A small simulated world drives one job: the scheduler allocates gangs, ranks
start, pause, fail and exit, workers vanish, timers fire, users ask for
anything at any time (refused requests included), late events of earlier
gang starts arrive. Whatever the order, the slot accounting must hold.
"""

from __future__ import annotations

import collections

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clustersdk.control import events as ev
from clustersdk.control.lifecycle import Lifecycle
from clustersdk.errors import ClusterSDKError
from clustersdk.protocol import ExitStatus, WireSpec

EXITS = [ExitStatus.OK, ExitStatus.STOPPED, ExitStatus.SUSPENDED, ExitStatus.FAILED]
ERROR = {"rank": 0, "type": "RuntimeError", "message": "boom", "traceback": ""}


class World:
    """One job and what the control plane would see of it; checks invariants as it goes."""

    def __init__(
        self,
        world_size: int,
        max_restarts: int,
        checkpoints: bool,
        on_hang: str = "report",
        on_error: str = "fail",
    ):
        self.job = Lifecycle(
            WireSpec(
                id="j",
                name="j",
                world_size=world_size,
                max_restarts=max_restarts,
                on_hang=on_hang,
                on_error=on_error,
                debug=True,
                checkpoint_dir="/ck" if checkpoints else None,
            ),
            failure_grace=1.0,
        )
        self.now = 0.0
        self.allocated: set[str] = set()  # every worker a gang was given (unique per gang)
        self.freed: collections.Counter = collections.Counter()
        self.releases = 0
        self.live: set[int] = set()  # ranks of the current gang that may still report
        self.gangs = 0

    # --- feeding, with the invariants checked after every event ---------------------------
    def feed(self, event: ev.Event) -> None:
        self.now += 0.1
        before = (self.job.status, list(self.job.words), self.job.spec)
        released_before = self.job.released
        restarts_before = self.job.restarts
        try:
            actions = self.job.handle(event, self.now)
        except ClusterSDKError:  # a refused request changes nothing
            assert (self.job.status, list(self.job.words), self.job.spec) == before
            return
        if released_before:
            assert actions == [], "a released job acts no more"
        if isinstance(event, (ev.Preempted, ev.Reclaimed)):
            assert self.job.restarts == restarts_before, "a preemption used the restart budget"
        for action in actions:
            if isinstance(action, ev.FreeSlot):
                assert action.worker in self.allocated, f"{action.worker} was never given"
                self.freed[action.worker] += 1
                assert self.freed[action.worker] == 1, f"{action.worker} freed twice"
            elif isinstance(action, ev.Release):
                self.releases += 1
            elif isinstance(action, ev.StartGang):
                assert isinstance(event, ev.Allocated)
        self.check()

    def check(self) -> None:
        job = self.job
        assert self.releases <= 1, "released twice"
        if job.released:
            assert job.status.terminal and not job.held, "released while holding slots"
        if job.status.terminal and len(job.exited) >= job.world_size:
            assert job.released, "terminal, every rank out, and not released"
        if job.status.name in ("QUEUED", "SUSPENDED"):
            assert not job.held, f"{job.status.name} but holding slots {job.held}"

    # --- the world's moves -------------------------------------------------------------------
    def allocate(self) -> None:
        if self.job.status.name == "QUEUED" and not self.job.released:
            self.gangs += 1
            n = self.job.world_size
            self.allocated |= {f"w{self.gangs}-{i}" for i in range(n)}
            self.live = set(range(n))
            self.feed(
                ev.Allocated(tuple(ev.RankSlot(f"w{self.gangs}-{i}", "h", "cpu") for i in range(n)))
            )

    def rank_move(self, kind: int, pick: int) -> None:
        if not self.live:
            return
        rank = sorted(self.live)[pick % len(self.live)]
        attempt = self.job.attempt
        if kind == 0:
            self.feed(ev.Started(rank, attempt))
        elif kind == 1:
            self.feed(ev.Paused(rank, attempt, step=pick))
        elif kind == 2:
            self.feed(ev.Resumed(rank, attempt))
        elif kind == 3:
            self.feed(ev.Failed(rank, attempt, ERROR))
        elif kind == 4:
            self.live.discard(rank)
            self.feed(ev.Exited(rank, attempt, EXITS[pick % len(EXITS)]))
        elif kind == 5:
            self.live.discard(rank)
            self.feed(ev.StartFailed(rank, attempt, "OSError", "gone"))
        elif kind == 6:
            self.live.discard(rank)
            self.feed(ev.WorkerLost(rank, attempt, f"w{self.gangs}-{rank}", "h"))
        elif kind == 7:
            self.feed(
                ev.CheckpointCommitted(rank, attempt, seq=pick, step=pick, path=f"/ck/{pick}")
            )
        elif kind == 8:  # a late event of an earlier gang start
            self.feed(ev.Exited(rank, attempt - 1, ExitStatus.FAILED))
        elif kind == 9:  # raised under on_error="hold": it waits
            self.feed(ev.Held(rank, attempt, ERROR, [], step=pick))
        elif kind == 10:  # at a ctx.breakpoint(), its pdb session opens
            self.feed(ev.BreakpointHit(rank, attempt, k=1 + pick % 3, step=pick))
        elif kind == 11:  # the session printed, or ended (continue)
            self.feed(
                ev.ConsoleOutput(rank, attempt, k=1 + pick % 3, text="(Pdb) ", closed=pick % 2 == 0)
            )

    def request(self, kind: int, pick: int) -> None:
        self.feed(
            [
                ev.StopRequested(),
                ev.PauseRequested(),
                ev.PauseWithdrawn(),
                ev.ResumeRequested(world_size=[None, 1, 2][pick % 3]),
                ev.CheckpointRequested(),
                ev.SuspendRequested(),
                ev.GraceExpired(self.job.attempt),
                # the scheduling policy's: preemption (and its overdue stop), idle reclaim
                ev.Preempted(["suspend", "stop"][pick % 2], "for a higher job"),
                ev.Preempted("suspend", "for a higher job", overdue=True),
                ev.Reclaimed(["suspend", "stop"][pick % 2], "idle"),
                # the hang watchdog's: found hung, a step after all, ranks that never stop
                ev.HangDetected(9.0, 6.0, "rank 0 in step", 1.0),
                ev.Progressed(),
                ev.StopOverdue(self.job.attempt, 1.0),
                # holds: the owner's restart, the hold timeout
                ev.RestartRequested(),
                ev.HoldExpired(self.job.attempt),
            ][kind % 15]
        )

    def drain(self) -> None:
        """Every rank still out there exits; nothing may be left holding a slot."""
        for rank in sorted(self.live):
            self.feed(ev.Exited(rank, self.job.attempt, ExitStatus.STOPPED))
        self.live.clear()
        self.feed(ev.GraceExpired(self.job.attempt))


moves = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 14), st.integers(0, 7)), max_size=60)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    world_size=st.integers(1, 4),
    max_restarts=st.integers(0, 2),
    checkpoints=st.booleans(),
    on_hang=st.sampled_from(["report", "restart", "fail"]),
    on_error=st.sampled_from(["fail", "hold"]),
    moves=moves,
)
def test_no_sequence_of_events_leaks_a_slot_or_releases_twice(
    world_size, max_restarts, checkpoints, on_hang, on_error, moves
):
    world = World(world_size, max_restarts, checkpoints, on_hang, on_error)
    for group, kind, pick in moves:
        if group == 0:
            world.allocate()
        elif group == 1:
            world.rank_move(kind, pick)
        else:
            world.request(kind, pick)
    world.drain()
    job = world.job
    # every started gang is freed exactly once: each allocated slot was given back
    assert set(world.freed) == set(world.allocated), "a slot of a started gang was never freed"
    assert all(count == 1 for count in world.freed.values())
    assert not job.held
    # and the job is either over (released once) or waiting without slots
    if job.status.terminal:
        assert job.released and world.releases == 1
    else:
        assert job.status.name in ("QUEUED", "SUSPENDED"), job.status
        assert world.releases == 0


@settings(max_examples=100, deadline=None)
@given(world_size=st.integers(1, 4), moves=moves)
def test_without_a_lost_worker_or_restart_budget_a_failure_is_final(world_size, moves):
    """With max_restarts=0 no event sequence brings a FAILED job back."""
    world = World(world_size, max_restarts=0, checkpoints=True)
    failed_once = False
    for group, kind, pick in moves:
        if group == 0:
            world.allocate()
        elif group == 1:
            world.rank_move(kind, pick)
        else:
            world.request(kind, pick)
        failed_once |= world.job.status.name == "FAILED"
        if failed_once:
            assert world.job.status.name == "FAILED"
