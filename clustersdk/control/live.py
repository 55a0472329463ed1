"""``job.run`` and ``job.update`` requests of one job, and what its ranks reported (pure;
kept by the lifecycle as ``job.live``, a :class:`LiveRequests`).

The control vector carries ints only, so requests are *pulled*: each request
gets a sequence number (one counter for both kinds), the control plane keeps
it here and raises the RUN or UPDATE word to it; at the next point where the
ranks agree on the vector, a rank that sees a number beyond what it did asks
for the requests up to the agreed number (:meth:`LiveRequests.pending`) and
carries them out in order (:mod:`clustersdk.runtime.live`). Bounding by the
agreed number gives every rank the same list, also when a newer request
arrives between their questions.

- A **run** holds the pickled function (in memory only: never journaled),
  the ranks chosen, and per rank its pickled result or its error. A gang
  that ends before a chosen rank ran it (a restart, a suspend) closes it with
  an error for that rank: a new gang never runs an earlier gang's function.
- An **update** holds the checked changes (:mod:`.hparams`), the step its ranks
  applied it before, and their old values. A new gang (restart, resume) starts
  with one *carried* update: every change asked so far, merged, which its ranks
  apply at their first boundary. Values already in place (restored from a
  checkpoint taken after the change, or in the spec) are left as they are, so a
  new gang never misses a change, and repeating one changes nothing.

>>> book = LiveRequests()
>>> book.ask_run(b"fn", [0, 1], now=0.0, attempt=0, limit=1024)
1
>>> [e["seq"] for e in book.pending(0, 1, runs=(0, 1), updates=(0, 0))]
[1]
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from .. import hparams
from ..errors import InvalidTransitionError, SpecError
from ..protocol import Word
from ..status import JobStatus
from . import events as ev
from .view import JobView

#: The states in which job.update reaches the ranks (they agree on a step boundary).
LIVE_STATES = frozenset({JobStatus.RUNNING, JobStatus.PAUSED})
#: ... and job.run: also a HELD job, whose held ranks run it while they wait (they agree
#: on nothing, so a function there must not use collectives).
RUN_STATES = LIVE_STATES | {JobStatus.HELD}
KEEP_RESULTS = 16  # run requests whose results are kept for a (late) reader


class RunEntry(TypedDict):
    """A ``job.run`` request and what its ranks reported."""

    seq: int
    kind: Literal["run"]
    ranks: list[int]  # the ranks chosen to run it
    requested: float
    attempt: int  # the gang asked
    limit: int  # the most bytes of a pickled result
    fn: bytes | None  # pickled; None once every chosen rank has it
    fetched: set[int]  # the ranks that took it
    results: dict[int, bytes | None]  # rank -> its pickled result
    errors: dict[int, dict[str, Any]]  # rank -> its error
    complete: bool


class UpdateEntry(TypedDict):
    """A ``job.update`` request and what its ranks reported."""

    seq: int
    kind: Literal["update"]
    changes: dict[str, Any]  # checked by hparams.check
    requested: float
    attempt: int
    step: int | None  # applied before it (None: not yet)
    old: dict[str, list[Any]]  # key -> [old, new] as the ranks applied it
    ranks: set[int]  # the ranks that reported it
    error: dict[str, Any] | None  # why it was refused


class Carry(TypedDict):
    """Every change so far, merged: what a new gang applies first."""

    seq: int
    attempt: int
    changes: dict[str, Any]
    seqs: list[int]  # the updates it carries


class LiveRequests:
    """One job's run and update requests, and what its ranks reported."""

    def __init__(self) -> None:
        self.seq = 0  # the newest request, of either kind
        self.runs: dict[int, RunEntry] = {}
        self.updates: dict[int, UpdateEntry] = {}
        self.info: dict[int, dict[str, Any]] = {}  # rank -> what job.update's checks need
        self.carry: Carry | None = None  # the current gang's carried update

    # --- runs ------------------------------------------------------------------------
    def ask_run(self, fn: bytes, ranks: list[int], *, now: float, attempt: int, limit: int) -> int:
        self.seq += 1
        self.runs[self.seq] = {
            "seq": self.seq,
            "kind": "run",
            "ranks": list(ranks),
            "requested": now,
            "attempt": attempt,
            "limit": limit,
            "fn": fn,
            "fetched": set(),
            "results": {},
            "errors": {},
            "complete": False,
        }
        for old in sorted(self.runs)[:-KEEP_RESULTS]:  # results nobody came for
            if self.runs[old]["complete"]:  # (one a rank has still to run stays)
                self.runs.pop(old)
        return self.seq

    def ran_by(
        self, seq: int, rank: int, result: bytes | None, error: dict[str, Any] | None
    ) -> bool:
        """Rank ``rank`` ran request ``seq``; True once every chosen rank has."""
        entry = self.runs.get(seq)
        if entry is None or entry["complete"] or rank not in entry["ranks"]:
            return False
        if error is not None:
            entry["errors"][rank] = error
        else:
            entry["results"][rank] = result
        entry["complete"] = len(entry["results"]) + len(entry["errors"]) >= len(entry["ranks"])
        return entry["complete"]

    # --- updates ------------------------------------------------------------------------
    def ask_update(self, changes: dict[str, Any], *, now: float, attempt: int) -> int:
        self.seq += 1
        self.updates[self.seq] = {
            "seq": self.seq,
            "kind": "update",
            "changes": changes,
            "requested": now,
            "attempt": attempt,
            "step": None,
            "old": {},
            "ranks": set(),
            "error": None,
        }
        return self.seq

    def updated_by(
        self,
        seq: int,
        rank: int,
        step: int | None,
        changes: dict[str, list[Any]],
        error: dict[str, Any] | None,
    ) -> list[UpdateEntry]:
        """Rank ``rank`` applied update ``seq`` (or the carried one) before ``step``, or
        refused it; the entries this report applied for the first time."""
        carry = self.carry
        seqs = carry["seqs"] if carry is not None and seq == carry["seq"] else [seq]
        fresh = []
        for s in seqs:
            entry = self.updates.get(s)
            if entry is None:
                continue
            entry["ranks"].add(rank)
            if error is not None:
                if entry["step"] is not None:
                    continue  # applied by an earlier gang: that stays true
                if entry["error"] is None or error.get("cause"):
                    entry["error"] = error  # the refusing rank's own reason wins
            elif entry["step"] is None and entry["error"] is None:
                entry["step"] = step
                entry["old"] = {k: changes[k] for k in entry["changes"] if k in changes}
                fresh.append(entry)
        return fresh

    def done(self, seq: int, world_size: int) -> bool:
        """Whether update ``seq`` is applied (or refused) by every rank."""
        entry = self.updates.get(seq)
        return (
            entry is None
            or entry["error"] is not None
            or (entry["step"] is not None and len(entry["ranks"]) >= world_size)
        )

    # --- what a rank asks for ---------------------------------------------------------------
    def pending(
        self, attempt: int, rank: int, runs: tuple[int, int], updates: tuple[int, int]
    ) -> list[dict[str, Any]]:
        """The requests rank ``rank`` of gang ``attempt`` must carry out, in order: the runs
        with ``runs[0] < seq <= runs[1]`` that chose it, the updates likewise."""
        out = []
        for seq in range(runs[0] + 1, runs[1] + 1):
            entry = self.runs.get(seq)
            if entry is None or entry["attempt"] != attempt or rank not in entry["ranks"]:
                continue
            entry["fetched"].add(rank)
            out.append({"seq": seq, "kind": "run", "fn": entry["fn"], "limit": entry["limit"]})
            if entry["fetched"] >= set(entry["ranks"]):
                entry["fn"] = None  # every chosen rank has it: no need to keep it
        carry = self.carry
        if (
            carry is not None
            and carry["attempt"] == attempt
            and updates[0] < carry["seq"] <= updates[1]
        ):
            out.append(
                {
                    "seq": carry["seq"],
                    "kind": "update",
                    "changes": carry["changes"],
                    "carried": True,
                }
            )
        for seq in range(updates[0] + 1, updates[1] + 1):
            update = self.updates.get(seq)  # of this gang: an earlier one's come carried
            if update is not None and update["attempt"] == attempt and update["error"] is None:
                out.append({"seq": seq, "kind": "update", "changes": update["changes"]})
        return sorted(out, key=lambda e: e["seq"])

    # --- a new gang ----------------------------------------------------------------------------
    def gang_started(self, attempt: int) -> int:
        """Gang ``attempt`` starts: close the runs of earlier gangs and carry every change so
        far; the UPDATE word it starts with (0: nothing to carry)."""
        for entry in self.runs.values():
            if entry["attempt"] < attempt and not entry["complete"]:
                for rank in entry["ranks"]:
                    if rank not in entry["results"] and rank not in entry["errors"]:
                        entry["errors"][rank] = {
                            "type": "GangEnded",
                            "traceback": "",
                            "message": f"the job's ranks stopped (a restart or a suspend) before "
                            f"rank {rank} ran the function; it was not run",
                        }
                entry["complete"], entry["fn"] = True, None
        net: dict[str, Any] = {}
        seqs = []
        for seq in sorted(self.updates):
            update = self.updates[seq]
            if update["error"] is None:
                net = hparams.merge(net, update["changes"])
                seqs.append(seq)
                update["ranks"] = set()  # the new gang's ranks report it again (carried)
        self.info = {}  # a new gang: its batch, perhaps its world size, differ
        if not seqs:
            self.carry = None
            return 0
        self.carry = {"seq": self.seq, "attempt": attempt, "changes": net, "seqs": seqs}
        return self.seq

    # --- events ---------------------------------------------------------------------------
    def run_requested(self, job: JobView, e: ev.RunRequested) -> None:
        """A function for ``e.ranks`` (None: every rank; of a HELD job, its held ranks), at
        their next agreed boundary (a held rank: at once)."""
        _check_live(job, "job.run", RUN_STATES)
        if e.ranks is None and job.status is JobStatus.HELD:
            ranks = job.held_ranks
        else:
            ranks = list(range(job.world_size)) if e.ranks is None else list(e.ranks)
        bad = [
            r
            for r in ranks
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < job.world_size
        ]
        if bad or not ranks or len(set(ranks)) != len(ranks):
            raise SpecError(
                f"job.run(ranks={e.ranks!r}): name distinct ranks from 0 to "
                f"{job.world_size - 1} (job {job.name!r} has {job.world_size}), or "
                "None for every rank"
            )
        seq = self.ask_run(e.fn, sorted(ranks), now=job.now, attempt=job.attempt, limit=e.limit)
        job.ask(Word.RUN, seq)

    def ran(self, job: JobView, e: ev.Ran) -> None:
        self.ran_by(e.seq, e.rank, e.result, e.error)  # a waiting job.run: the plane wakes it

    def update_requested(self, job: JobView, e: ev.UpdateRequested) -> None:
        """Changes for every rank, applied before one step (checked first: see
        :mod:`clustersdk.hparams`)."""
        _check_live(job, "job.update")
        changes = hparams.check(e.changes, job.spec, self.info)
        seq = self.ask_update(changes, now=job.now, attempt=job.attempt)
        job.ask(Word.UPDATE, seq)

    def updated(self, job: JobView, e: ev.Updated) -> None:
        """A rank applied (or refused) an update; the first report of a change is its
        durable event, its loss-chart marker and, for launch options, the spec's new
        value."""
        for entry in self.updated_by(e.seq, e.rank, e.step, e.changes, e.error):
            old_new = {
                k: [entry["old"][k][0] if k in entry["old"] else None, v]
                for k, v in entry["changes"].items()
            }
            job.record(
                "updated",
                f"{hparams.describe(old_new)} (before step {e.step})",
                seq=entry["seq"],
                step=e.step,
                changes=old_new,
            )
            # (an applied report has its step: e.step is None only beside an error, and
            # updated_by returns no entry for an error)
            job.emit(
                ev.Publish(
                    {
                        "kind": "updated",
                        "seq": entry["seq"],
                        "step": e.step,  # type: ignore[typeddict-item]
                        "changes": old_new,
                    }
                )
            )
            options = hparams.spec_changes(entry["changes"])
            if options:
                job.replace_spec(**options)

    def tunable(self, job: JobView, e: ev.Tunable) -> None:
        self.info[e.rank] = e.info


def _check_live(job: JobView, what: str, states: frozenset[JobStatus] = LIVE_STATES) -> None:
    if job.status not in states:
        names = [
            s.name for s in (JobStatus.RUNNING, JobStatus.PAUSED, JobStatus.HELD) if s in states
        ]
        allowed = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
        raise InvalidTransitionError(
            f"job {job.name!r} is {job.status.name}; {what} needs a {allowed} job"
        )
