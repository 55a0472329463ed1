"""``job.run`` and ``job.update`` on a rank: code and changes carried out in the rank's
own training thread, at a boundary where every rank agreed on the control vector.

When the agreed RUN or UPDATE word is beyond what this rank did, it asks the
control plane for the requests up to that word (:meth:`Live.act`; every rank
gets the same list, see :mod:`clustersdk.control.live`) and carries them out
in order:

- a **run** calls the function with ``ctx``: it sees the live model
  (``ctx.model``), what was registered (``ctx.registered``) or exposed
  (``ctx.expose``). Whatever it raises, or a result that can't be pickled or is
  over the limit, goes back as this rank's error: it never fails the job, and a
  PAUSED job stays paused. When it runs on every rank it may use collectives.
- an **update** is checked on the rank too (its optimizers, its batch), the ranks
  agree that every one of them can take it (one all-reduce), and each applies it
  before the same step (:mod:`.tuning`), reporting old and new values.

A :class:`Live` holds what those functions may see besides ``ctx``
(``ctx.expose`` / ``ctx.exposed``) and the hyperparameters updates change
(``ctx.hparams``).
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import cloudpickle
import torch
from dask.utils import format_bytes

from ..protocol import RankEvent, Word
from . import tuning
from .control_words import JobSuspended

if TYPE_CHECKING:
    from .context import TrainContext
    from .tuning import Tunables

HPARAMS_KEY = "clustersdk_hparams"  # ctx.hparams in a checkpoint (when the launch had some)
INTERNAL = frozenset({"training", HPARAMS_KEY})  # stateful entries the user did not register


class HParams:
    """``ctx.hparams`` as a checkpoint entry: restored in place, so references stay live."""

    def __init__(self, values: dict[str, Any]):
        self.values = values

    def state_dict(self) -> dict[str, Any]:
        return {"values": json.dumps(self.values, sort_keys=True)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.values.clear()
        self.values.update(json.loads(state["values"]))


class Live:
    """One rank's side of ``job.run`` and ``job.update``.

    ``fetch(runs=[done, upto], updates=[done, upto])`` asks the control plane for the
    requests in those ranges (the agent's bridge; None outside a cluster); ``report``
    tells it what they did; ``group`` (the control group) is where the ranks agree that
    every one of them can take an update. ``phase`` is ``"run"`` while a function runs
    (``job.stacks()`` and the hang watchdog see it), else None.
    """

    def __init__(
        self,
        *,
        fetch: Callable[..., list] | None,
        report: Callable[..., None],
        group: Any,
        rank: int,
        world_size: int,
        hparams: Mapping[str, Any] | None = None,
    ):
        self.fetch, self.report, self.group = fetch, report, group
        self.rank, self.world_size = rank, world_size
        self.runs_done = 0  # the newest RUN request carried out
        self.updates_done = 0  # the newest UPDATE request carried out
        self.exposed: dict[str, Any] = {}
        self.hparams: dict[str, Any] = dict(hparams or {})
        self.batch: int | None = None  # this rank's batch, seen at its first step
        self.phase: str | None = None
        self._told = False

    def due(self, words: list[int]) -> bool:
        return words[Word.RUN] > self.runs_done or words[Word.UPDATE] > self.updates_done

    def act(self, words: list[int], ctx: TrainContext, tunables: Callable[[], Tunables]) -> None:
        """Carry out the requests up to the agreed words, in order: runs are called with
        ``ctx``, updates change what ``tunables()`` offers."""
        if self.fetch is None:
            return
        entries = self.fetch(
            runs=[self.runs_done, words[Word.RUN]], updates=[self.updates_done, words[Word.UPDATE]]
        )
        self.runs_done = max(self.runs_done, words[Word.RUN])
        self.updates_done = max(self.updates_done, words[Word.UPDATE])
        for entry in entries:
            if entry["kind"] == "run":
                self._run(entry, ctx)
            else:
                self._update(entry, ctx.step, tunables())

    def act_alone(self, words: list[int], ctx: TrainContext) -> None:
        """While this rank waits alone (held, or at another rank's breakpoint): the runs
        up to what it knows, not the updates (their ranks agree on one step boundary;
        they wait for the next agreed one)."""
        if self.fetch is None or words[Word.RUN] <= self.runs_done:
            return
        entries = self.fetch(
            runs=[self.runs_done, words[Word.RUN]], updates=[self.updates_done, self.updates_done]
        )
        self.runs_done = max(self.runs_done, words[Word.RUN])
        for entry in entries:
            if entry["kind"] == "run":
                self._run(entry, ctx)

    # --- job.run ---------------------------------------------------------------------------
    def _run(self, entry: dict[str, Any], ctx: TrainContext) -> None:
        phase, self.phase = self.phase, "run"  # job.stacks() and the hang watchdog see it
        try:
            outcome = call(entry["fn"], ctx, entry["limit"])
        finally:
            self.phase = phase
        self.report(RankEvent.RAN, seq=entry["seq"], **outcome)

    # --- job.update --------------------------------------------------------------------------
    def _update(self, entry: dict[str, Any], step: int, tunables: Tunables) -> None:
        error = None
        try:
            changes = tuning.plan(tunables, entry["changes"], self.batch)
        except Exception as e:  # noqa: BLE001 - refused on this rank: nobody applies it
            changes, error = (
                [],
                {"rank": self.rank, "type": type(e).__name__, "message": str(e), "cause": True},
            )
        if not self._everyone_can(error is None):
            error = error or {
                "rank": self.rank,
                "type": "Refused",
                "message": "another rank refused the update",
            }
            self.report(RankEvent.UPDATED, seq=entry["seq"], step=step, error=error)
            return
        for change in changes:
            change.apply()
        self.report(
            RankEvent.UPDATED,
            seq=entry["seq"],
            step=step,
            changes={c.key: [c.old, c.new] for c in changes},
        )

    def _everyone_can(self, ok: bool) -> bool:
        """Whether every rank can apply the update (one MIN all-reduce): all or none do."""
        if self.world_size == 1 or self.group is None:
            return ok
        import torch.distributed as dist

        flag = torch.tensor([int(ok)], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())

    # --- what the control plane's checks need -------------------------------------------------
    def first_step(self, batch: Any, tunables: Tunables) -> None:
        """After the rank's first step: tell the control plane what job.update may change."""
        if self._told:
            return
        self._told = True
        self.batch = batch_size(batch)
        info = {
            "optimizers": tuning.optimizers_info(tunables.stateful),
            "batch": self.batch,
            "calls": sorted(tunables.called),
        }
        self.report(RankEvent.TUNABLE, info=info)


def call(payload: bytes, ctx: Any, limit: int) -> dict[str, Any]:
    """``fn(ctx)`` of a pickled ``fn``: ``{"result": pickled}`` or ``{"error": {...}}``.

    Everything it raises is caught, but what ends the rank's loop on purpose (a
    suspend, an interrupt of the worker).
    """
    try:
        fn = cloudpickle.loads(payload)
        result = fn(ctx)
    except (JobSuspended, KeyboardInterrupt):
        raise
    except BaseException as e:  # noqa: BLE001 - the user's code: its error is the result
        if e.__context__ is not None and e.__context__ is getattr(ctx, "error", None):
            e.__suppress_context__ = True  # on a held rank: not "during handling of" its error
        # the traceback from the user's function on (this module's frame left out)
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        return {
            "error": {
                "rank": ctx.rank,
                "type": type(e).__name__,
                "message": str(e),
                "traceback": "".join(traceback.format_exception(type(e), e, tb)),
            }
        }
    try:
        data = cloudpickle.dumps(result)
    except Exception as e:  # noqa: BLE001
        return {
            "error": {
                "rank": ctx.rank,
                "type": "UnpicklableResult",
                "traceback": "",
                "message": f"the function returned a {type(result).__name__}, which "
                f"can't be pickled ({type(e).__name__}: {e}); return plain "
                "data (numbers, lists, dicts, tensors)",
            }
        }
    if len(data) > limit:
        return {
            "error": {
                "rank": ctx.rank,
                "type": "ResultTooLarge",
                "traceback": "",
                "message": f"the result is {format_bytes(len(data))} pickled, over the "
                f"limit of {format_bytes(limit)} (clustersdk.run-result-limit "
                "on the scheduler); return a summary, or raise the limit",
            }
        }
    return {"result": data}


def batch_size(batch: Any) -> int | None:
    """The leading size of the first tensor in ``batch`` (a tensor, tuple, list or dict).

    >>> batch_size((torch.zeros(8, 3), torch.zeros(8)))
    8
    """
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = batch_size(item)
            if size is not None:
                return size
    return None
