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
  that ends after a chosen rank took it, before every chosen rank ran it (a
  restart, a suspend), closes it with an error for each rank left: a new gang
  never runs a function an earlier gang began. One that no rank took yet (asked
  while the job was QUEUED or STARTING, or just before its gang ended) is the new
  gang's to run, at its first boundary.
- An **update** holds the checked changes (:mod:`.hparams`), the step its ranks
  applied it before, and their old values. One asked before any rank reported
  what the checks need (a QUEUED or STARTING job's) is checked as far as the job's
  spec allows, and by every rank before its first step. A new gang (restart, resume) starts
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
from ..status import EARLY, JobStatus
from . import events as ev
from .view import JobView

#: The states in which job.update reaches the ranks (they agree on a step boundary).
LIVE_STATES = frozenset({JobStatus.RUNNING, JobStatus.PAUSED})
#: ... and job.run: also a HELD job, whose held ranks run it while they wait (they agree
#: on nothing, so a function there must not use collectives).
RUN_STATES = LIVE_STATES | {JobStatus.HELD}
#: ... and what a job may be asked before its first step boundary, where its ranks take it.
ASK_STATES = LIVE_STATES | EARLY
KEEP_RESULTS = 16  # run requests whose results are kept for a (late) reader


class RunEntry(TypedDict):
    """A ``job.run`` request and what its ranks reported."""

    seq: int
    kind: Literal["run"]
    ranks: list[int]  # the ranks chosen to run it
    requested: float
    attempt: int  # the gang asked
    carries: bool  # a new gang runs it if no rank took it (not a HELD job's: its post-mortem)
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
    def ask_run(
        self,
        fn: bytes,
        ranks: list[int],
        *,
        now: float,
        attempt: int,
        limit: int,
        carries: bool = True,
    ) -> int:
        self.seq += 1
        self.runs[self.seq] = {
            "seq": self.seq,
            "kind": "run",
            "ranks": list(ranks),
            "requested": now,
            "attempt": attempt,
            "carries": carries,
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
        carried = set(carry["seqs"]) if carry is not None and carry["attempt"] == attempt else ()
        for seq in range(updates[0] + 1, updates[1] + 1):
            update = self.updates.get(seq)  # of this gang: an earlier one's come carried
            if (
                update is not None
                and update["attempt"] == attempt
                and update["error"] is None
                and seq not in carried  # asked before the gang started: in its carry
            ):
                out.append({"seq": seq, "kind": "update", "changes": update["changes"]})
        return sorted(out, key=lambda e: e["seq"])

    # --- what waits for the ranks -----------------------------------------------------------
    def waiting(self, attempt: int) -> list[dict[str, Any]]:
        """The updates no rank applied yet, and the runs of gang ``attempt`` (or carried to
        it) no rank took yet, oldest first, as the job's record shows them."""
        out: list[dict[str, Any]] = [
            {"op": "update", "seq": seq, "changes": u["changes"]}
            for seq, u in self.updates.items()
            if u["step"] is None and u["error"] is None
        ]
        out += [
            {"op": "run", "seq": seq, "ranks": list(r["ranks"])}
            for seq, r in self.runs.items()
            if not r["complete"] and not r["fetched"] and (r["attempt"] == attempt or r["carries"])
        ]
        return sorted(out, key=lambda p: p["seq"])

    # --- a new gang ----------------------------------------------------------------------------
    def gang_started(self, attempt: int, world_size: int) -> tuple[int, int]:
        """Gang ``attempt`` of ``world_size`` ranks starts: it takes the runs no rank took
        (closing the others of earlier gangs) and every change so far; the RUN and UPDATE
        words it starts with (0: nothing to run or carry)."""
        run = 0
        for seq, entry in self.runs.items():
            if entry["complete"]:
                continue
            untouched = not (entry["fetched"] or entry["results"] or entry["errors"])
            fits = all(r < world_size for r in entry["ranks"])
            if entry["attempt"] == attempt and fits:
                continue  # asked while it was QUEUED: its word is the gang's already
            if untouched and fits and entry["carries"]:
                entry["attempt"], run = attempt, seq
                continue
            for rank in entry["ranks"]:
                if rank not in entry["results"] and rank not in entry["errors"]:
                    entry["errors"][rank] = {
                        "type": "GangEnded",
                        "traceback": "",
                        "message": f"the job's ranks stopped (a restart or a suspend) before "
                        f"rank {rank} ran the function; it was not run"
                        if fits
                        else f"the job started on {world_size} rank(s): it has no rank {rank} "
                        "to run the function",
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
            return run, 0
        self.carry = {"seq": self.seq, "attempt": attempt, "changes": net, "seqs": seqs}
        return run, self.seq

    # --- events ---------------------------------------------------------------------------
    def run_requested(self, job: JobView, e: ev.RunRequested) -> None:
        """A function for ``e.ranks`` (None: every rank; of a HELD job, its held ranks), at
        their next agreed boundary (a held rank: at once; a QUEUED or STARTING job's: at its
        first)."""
        _check_live(job, "job.run", RUN_STATES | EARLY)
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
        seq = self.ask_run(
            e.fn,
            sorted(ranks),
            now=job.now,
            attempt=job.attempt,
            limit=e.limit,
            carries=job.status is not JobStatus.HELD,
        )
        job.ask(Word.RUN, seq)

    def ran(self, job: JobView, e: ev.Ran) -> None:
        self.ran_by(e.seq, e.rank, e.result, e.error)  # a waiting job.run: the plane wakes it

    def update_requested(self, job: JobView, e: ev.UpdateRequested) -> None:
        """Changes for every rank, applied before one step (checked first: see
        :mod:`clustersdk.hparams`; before any rank reported, as far as the spec allows: its
        ranks check the rest before their first step)."""
        _check_live(job, "job.update", ASK_STATES)
        deferred = not self.info  # no rank has run a step yet (QUEUED, STARTING, paused at 0)
        changes = hparams.check(e.changes, job.spec, self.info, deferred=deferred)
        seq = self.ask_update(changes, now=job.now, attempt=job.attempt)
        job.ask(Word.UPDATE, seq)

    def updated(self, job: JobView, e: ev.Updated) -> None:
        """A rank applied (or refused) an update; the first report of a change is its
        durable event, its loss-chart marker and, for launch options, the spec's new
        value; the rank's reason of a refusal is one too (nobody may be waiting for it)."""
        if e.error is not None and e.error.get("cause"):
            job.record(
                "update_refused",
                f"rank {e.rank} refused job.update #{e.seq}: {e.error.get('message')}",
                seq=e.seq,
                rank=e.rank,
                error=e.error,
            )
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
        early = f", {NOT_STARTED}" if EARLY <= states else ""
        raise InvalidTransitionError(
            f"job {job.name!r} is {job.status.name}; {what} needs a {allowed} job{early}"
        )


#: How the states of :data:`~clustersdk.status.EARLY` read in a refusal's message.
NOT_STARTED = "or one not started yet (QUEUED or STARTING)"
