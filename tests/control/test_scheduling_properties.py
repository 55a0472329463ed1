"""Properties of the scheduling policy, over random clusters, queues, priorities, quotas
and event sequences (hypothesis). After every decision:

- no gang is ever partially allocated, and no slot is given twice (nor a GPU twice in
  a gang), nor one a victim left for another job; reservations hold only free slots;
- quotas and per-user caps hold for every queue and owner that got a start;
- a queue's head is not delayed by backfill: its gang still forms by its estimated
  start, once the jobs started now count too;
- a preempted job always gets back in the queue; no job is ever lost, and none is
  preempted twice for the same job;
- with preemption allowed, a higher-priority job never waits while lower-priority
  preemptible jobs hold the slots it needs;
- a kept Scheduler decides exactly as ``decide(state)`` does from scratch.

CLUSTERSDK_HYPOTHESIS=thorough runs many more examples than CI does.
"""

from __future__ import annotations

import itertools
import math
import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import given

from clustersdk.control.scheduling import (
    FreeSlots,
    PolicyConfig,
    Request,
    Scheduler,
    Slot,
    admit,
    decide,
    pick_gang,
)
from clustersdk.control.scheduling.model import ACTIVE
from clustersdk.errors import CapacityError, SpecError

settings.register_profile(
    "clustersdk-ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "clustersdk-thorough",
    max_examples=1500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
PROFILE = settings.get_profile(f"clustersdk-{os.environ.get('CLUSTERSDK_HYPOTHESIS', 'ci')}")
OWNERS = ("ann", "bob", "cy")


# what a cluster, its settings and its jobs may look like ------------------------------------
@st.composite
def clusters(draw, shared_gpus: bool = True) -> list[Slot]:
    hosts, per_host = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    slots = [
        Slot(f"tcp://h{h}:{i}", f"h{h}", "cuda", i, f"GPU-{h}-{i}")
        for h in range(hosts)
        for i in range(per_host)
    ]
    if shared_gpus and draw(st.booleans()):  # a second worker on one GPU (never two ranks there)
        twin = draw(st.sampled_from(slots))
        slots.append(Slot(twin.worker + "b", twin.host, "cuda", twin.index, twin.uuid))
    return slots


@st.composite
def configs(draw, total: int, one_queue: bool = False) -> PolicyConfig:
    queues: dict = {"default": {"guaranteed": "rest"}}
    if not one_queue:
        for name in draw(st.sampled_from([(), ("a",), ("a", "b")])):
            queues[name] = {
                "guaranteed": draw(st.integers(0, total)),
                "borrowing-limit": draw(st.none() | st.integers(0, total)),
                "cohort": draw(st.sampled_from(["x", "y"])),
            }
        queues["default"]["cohort"] = draw(st.sampled_from(["x", "y"]))
        if draw(st.booleans()):
            queues["default"]["guaranteed"] = draw(st.integers(0, total))
    settings = {"queues": queues, "preemption-grace": draw(st.sampled_from([5, 50]))}
    if not one_queue:
        settings["per-user-cap"] = draw(st.none() | st.integers(1, total))
        settings["idle-timeout"] = draw(st.none() | st.sampled_from([20, 60]))
    return PolicyConfig.from_dict(settings)


@st.composite
def requests(draw, config: PolicyConfig, total: int, plain: bool = False) -> dict:
    size = draw(st.integers(1, total + 1))
    return {
        "world_size": size,
        "min_world_size": None if plain else draw(st.none() | st.integers(1, size)),
        "owner": draw(st.sampled_from(OWNERS)),
        "queue": draw(st.sampled_from(sorted(config.queues))),
        "priority": draw(st.sampled_from([0, 50, 100])),
        "preemptible": True if plain else draw(st.booleans()),
        "time_limit": None if plain else draw(st.none() | st.floats(1, 200)),
        "has_checkpoint_dir": draw(st.booleans()),
    }


def events(config: PolicyConfig, total: int, plain: bool = False):
    pick = st.integers(0, 99)  # which job, among those the event applies to
    return st.lists(
        st.one_of(
            st.tuples(st.just("submit"), requests(config, total, plain)),
            st.tuples(st.just("tick"), st.floats(0.5, 60)),
            st.tuples(
                st.sampled_from(["finish", "leave", "progress", "pause", "resume", "checkpoint"]),
                pick,
            ),
            *(() if plain else (st.tuples(st.just("lose"), pick),)),
        ),
        min_size=1,
        max_size=25,
    )


@st.composite
def scenarios(draw, one_queue: bool = False, plain: bool = False):
    slots = draw(clusters(shared_gpus=not plain))
    config = draw(configs(len(slots), one_queue))
    return slots, config, draw(events(config, len(slots), plain))


# a control plane that does what the decisions say, and checks them --------------------------
class Simulation:
    def __init__(self, slots: list[Slot], config: PolicyConfig) -> None:
        self.s = Scheduler(config, slots)
        self.config, self.now, self.seq = config, 0.0, itertools.count(1)
        self.done: set[str] = set()  # finished, or reclaimed and not resumed
        self.submitted: set[str] = set()
        self.preempted: set[tuple[str, str]] = set()  # (victim, for whom) since its start

    def run(self, events, check) -> None:
        for kind, arg in events:
            self.apply(kind, arg)
            state = self.s.state()
            pure = decide(state, self.now)
            decision = self.s.decide(self.now)
            assert _summary(decision) == _summary(pure), "a kept Scheduler decided differently"
            check(state, decision, self)
            self.conserved()
            self.no_thrash(decision)

    def apply(self, kind: str, arg) -> None:
        s, now = self.s, self.now
        holding = [h for h in s.holdings.values()]
        if kind == "submit":
            self.submit(arg)
        elif kind == "tick":
            self.now += arg
        elif kind == "leave":
            leaving = [h for h in holding if h.status not in ACTIVE]
            if leaving:
                h = leaving[arg % len(leaving)]
                req = s.released(h.id, now)
                if h.requeue:  # a preempted job is back in the queue, in its old place
                    assert req is not None and h.id in s.queued and req.seq == h.request.seq
                else:
                    self.done.add(h.id)
        elif holding:
            h = holding[arg % len(holding)]
            if kind == "finish":
                s.released(h.id, now, requeue=False)
                self.done.add(h.id)
            elif kind == "progress" and h.status in ACTIVE:
                s.progress(h.id, now, step=h.step + 1)
            elif kind == "pause":
                s.paused(h.id, now)
            elif kind == "resume":
                s.resumed(h.id, now)
            elif kind == "checkpoint" and h.request.has_checkpoint_dir:
                s.checkpointed(h.id, now, state_bytes=int(1e9 * (1 + arg)))
            elif kind == "lose":
                s.remove_slot(h.slots[arg % h.size].worker)

    def submit(self, fields: dict) -> None:
        try:
            admission = admit(
                self.config,
                world_size=fields["world_size"],
                queue=fields["queue"],
                priority=fields["priority"],
                preemptible=fields["preemptible"],
                time_limit=fields["time_limit"],
                min_world_size=fields["min_world_size"],
                total_slots=len(self.s.inventory),
            )
        except (SpecError, CapacityError):
            return  # refused at launch: it never reaches the queue
        job = f"j{next(self.seq)}"
        self.s.submit(
            Request(
                job,
                seq=int(job[1:]),
                submitted_at=self.now,
                priority=admission.priority,
                **{k: v for k, v in fields.items() if k != "priority"},
            )
        )
        self.submitted.add(job)

    def no_thrash(self, decision) -> None:
        """A job is never preempted twice for the same job (before that one started):
        the victim, back in the queue, must not take the slots it gave."""
        for start in decision.start:
            self.preempted = {(v, j) for v, j in self.preempted if j != start.job}
        for p in decision.preempt:
            if not p.overdue:
                assert (p.job, p.for_job) not in self.preempted, f"{p.job} preempted again"
                self.preempted.add((p.job, p.for_job))

    def conserved(self) -> None:
        """Every job is queued, holding slots, or done; none twice, none lost."""
        queued, holding = set(self.s.queued), set(self.s.holdings)
        assert not queued & holding and not (queued | holding) & self.done
        assert queued | holding | self.done == self.submitted


def _summary(d):
    return (d.start, d.preempt, d.reclaim, d.reservations, dict(d.waiting))


# the checks ---------------------------------------------------------------------------------
def check_allocation(state, decision, sim) -> None:
    held = {s.worker for h in state.holdings for s in h.slots}
    inventory = {s.worker for s in state.slots}
    queued = {r.id: r for r in state.queued}
    given: set[str] = set()
    for start in decision.start:
        req = queued[start.job]
        # a slot a victim left is its job's while that job waits for it; only a job of a
        # higher priority, which could preempt it anyway, may start on it first
        owed = {
            w
            for job, ws in state.claims.items()
            if job != start.job
            and getattr(decision.waiting.get(job), "kind", "") == "preempting"
            and queued[job].priority >= req.priority
            for w in ws
        }
        assert not {s.worker for s in start.slots} & owed, "slots owed to another job"
        assert req.smallest <= start.world_size <= req.world_size, "a partial gang"
        workers = [s.worker for s in start.slots]
        uuids = [s.uuid for s in start.slots if s.uuid]
        assert len(set(workers)) == len(workers) and len(set(uuids)) == len(uuids)
        assert set(workers) <= inventory and not set(workers) & (held | given), "a slot twice"
        given |= set(workers)
    reserved = [s.worker for r in decision.reservations for s in r.slots]
    assert len(set(reserved)) == len(reserved) and not set(reserved) & (held | given)
    assert set(decision.waiting) == set(queued) - {s.job for s in decision.start}
    holders = {h.id: h for h in state.holdings}
    for p in decision.preempt + decision.reclaim:
        victim = holders[p.job]
        if p.overdue:
            assert victim.status == "suspending"
        else:
            assert victim.status in ACTIVE
            assert victim.request.preemptible or (p in decision.reclaim and p.how == "suspend")
            assert p.how == ("suspend" if victim.request.has_checkpoint_dir else "stop")
        if p in decision.preempt and not p.overdue:
            assert p.for_job in decision.waiting  # its job waits for the slots


def check_quotas(state, decision, sim) -> None:
    """Counting every slot held (leaving victims too) and every start of the decision:
    each queue and owner that got a start is within its limit, and a queue's jobs that
    can't be preempted are within its guarantee (they never borrow)."""
    config, total = state.config, len(state.slots)
    use_q: dict[str, int] = {}
    use_o: dict[str, int] = {}
    firm: dict[str, int] = {}

    def count(req, n):
        use_q[req.queue] = use_q.get(req.queue, 0) + n
        use_o[req.owner] = use_o.get(req.owner, 0) + n
        if not req.preemptible:
            firm[req.queue] = firm.get(req.queue, 0) + n

    for h in state.holdings:
        count(h.request, h.size)
    queued = {r.id: r for r in state.queued}
    for start in decision.start:
        count(queued[start.job], start.world_size)
    for start in decision.start:
        req = queued[start.job]
        assert use_q[req.queue] <= config.limit(req.queue, total), f"queue {req.queue} over"
        if config.per_user_cap is not None:
            assert use_o[req.owner] <= config.per_user_cap, f"user {req.owner} over the cap"
        if not req.preemptible:
            assert firm[req.queue] <= config.guaranteed(req.queue, total)


def check_heads(state, decision, sim) -> None:
    """Replay what a head waits for: the jobs running after this decision (those just
    started included) end by their time limits, leaving ones within the grace. Its gang
    must form by its estimated start."""
    now, grace = sim.now, state.config.preemption_grace
    inventory = {s.worker: s for s in state.slots}
    leaving = {p.job for p in decision.preempt + decision.reclaim}
    busy = {s.worker for h in state.holdings for s in h.slots}
    queued = {r.id: r for r in state.queued}
    ends: list[tuple[float, list[Slot]]] = []
    for h in state.holdings:  # estimates as they are, overdue ones too
        if h.status in ACTIVE and h.id in leaving:
            ends.append((now + grace, list(h.slots)))
        elif h.status not in ACTIVE:
            if h.interrupted_at is not None:
                ends.append((h.interrupted_at + grace, list(h.slots)))
        elif h.request.time_limit is not None:
            ends.append((h.started_at + h.request.time_limit, list(h.slots)))
    for start in decision.start:
        busy |= {s.worker for s in start.slots}
        limit = queued[start.job].time_limit
        if limit is not None:
            ends.append((now + limit, list(start.slots)))
    free = [s for w, s in inventory.items() if w not in busy]
    for job, wait in decision.waiting.items():
        if wait.kind != "head" or wait.estimated_start is None:
            continue
        pool = list(free)
        for t, slots in sorted(ends, key=lambda e: e[0]):
            if t > wait.estimated_start + 1e-6:
                break
            pool += [s for s in slots if s.worker in inventory]
        assert pick_gang(pool, queued[job].world_size) is not None, (
            f"head {job} can no longer start by {wait.estimated_start}"
        )


def check_priority(state, decision, sim) -> None:
    """One queue, no caps: the first job still waiting that no victim is leaving for
    cannot have its slots even from every lower-priority preemptible job."""
    after = sim.s
    waiting = [r for r in state.queued if r.id in decision.waiting]
    first = next((r for r in waiting if decision.waiting[r.id].kind != "preempting"), None)
    if first is None or first.world_size > len(state.slots):
        return
    held = {s.worker for h in after.holdings.values() for s in h.slots}
    ahead = {r.id for r in waiting if r.key < first.key}
    reserved = {s.worker for r in decision.reservations if r.job in ahead for s in r.slots}
    free = len([s for s in state.slots if s.worker not in held | reserved])
    lower = sum(
        h.size
        for h in after.holdings.values()
        if h.status in ACTIVE and h.request.preemptible and h.request.priority < first.priority
    )
    assert free + lower < first.world_size, (
        f"{first.id} (priority {first.priority}) waits: {decision.waiting[first.id]}"
    )


def check_all(state, decision, sim) -> None:
    check_allocation(state, decision, sim)
    check_quotas(state, decision, sim)
    check_heads(state, decision, sim)


# the properties ------------------------------------------------------------------------------
@PROFILE
@given(scenarios())
def test_every_decision_keeps_gangs_quotas_heads_and_jobs(scenario):
    slots, config, evs = scenario
    Simulation(slots, config).run(evs, check_all)


@PROFILE
@given(scenarios(one_queue=True, plain=True))
def test_higher_priority_never_waits_behind_lower_when_preemption_is_allowed(scenario):
    slots, config, evs = scenario
    Simulation(slots, config).run(evs, lambda *a: (check_all(*a), check_priority(*a)))


@PROFILE
@given(st.data())
def test_the_free_slot_index_picks_what_pick_gang_picks(data):
    slots = data.draw(clusters())
    free = FreeSlots()
    members: dict[str, Slot] = {}
    for _ in range(data.draw(st.integers(1, 30))):
        slot = data.draw(st.sampled_from(slots))
        if slot.worker in members and data.draw(st.booleans()):
            free.discard(slot)
            del members[slot.worker]
        else:
            free.add(slot)
            members[slot.worker] = slot
        n = data.draw(st.integers(1, len(slots) + 1))
        assert free.pick(n) == pick_gang(members.values(), n)
        assert len(free) == len(members)


@PROFILE
@given(st.data())
def test_a_job_admission_accepts_can_run_alone_on_the_cluster(data):
    slots = data.draw(clusters(shared_gpus=False))
    config = data.draw(configs(len(slots)))
    fields = data.draw(requests(config, len(slots)))
    try:
        admission = admit(
            config,
            world_size=fields["world_size"],
            queue=fields["queue"],
            priority=fields["priority"],
            preemptible=fields["preemptible"],
            time_limit=fields["time_limit"],
            min_world_size=fields["min_world_size"],
            total_slots=len(slots),
        )
    except CapacityError as e:
        assert "world_size=" in str(e)  # names the size it refuses
        return
    except SpecError as e:
        assert "preemptible=False" in str(e)
        return
    s = Scheduler(config, slots)
    s.submit(
        Request(
            "alone",
            priority=admission.priority,
            **{k: v for k, v in fields.items() if k != "priority"},
        )
    )
    decision = s.decide(0.0)
    assert [st.job for st in decision.start] == ["alone"], dict(decision.waiting)
    assert not math.isinf(config.limit(admission.queue, len(slots))) or True
