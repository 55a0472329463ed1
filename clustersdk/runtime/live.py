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

:class:`LiveContext` gives ``TrainContext`` its part: ``ctx.model``,
``ctx.registered``, ``ctx.expose`` / ``ctx.exposed`` and ``ctx.hparams``.
"""

from __future__ import annotations

import json
import traceback
import types
from typing import TYPE_CHECKING, Any, Callable, Mapping

import cloudpickle
import torch
from dask.utils import format_bytes

from ..protocol import RankEvent, Word
from . import tuning
from .control_words import JobSuspended

if TYPE_CHECKING:
    from .context import TrainContext

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
    requests in those ranges (the agent's bridge; None outside a cluster).
    """

    def __init__(self, ctx: TrainContext, fetch: Callable[..., list] | None):
        self.ctx = ctx
        self.fetch = fetch
        self.runs_done = 0      # the newest RUN request carried out
        self.updates_done = 0   # the newest UPDATE request carried out
        self.exposed: dict[str, Any] = {}
        self.hparams: dict[str, Any] = dict(ctx.spec.hparams or {})
        self.batch: int | None = None  # this rank's batch, seen at its first step
        self._told = False
        if self.hparams:
            ctx.stateful[HPARAMS_KEY] = HParams(self.hparams)

    def due(self, words: list[int]) -> bool:
        return words[Word.RUN] > self.runs_done or words[Word.UPDATE] > self.updates_done

    def act(self, words: list[int]) -> None:
        """Carry out the requests up to the agreed words, in order."""
        if self.fetch is None:
            return
        entries = self.fetch(runs=[self.runs_done, words[Word.RUN]],
                             updates=[self.updates_done, words[Word.UPDATE]])
        self.runs_done = max(self.runs_done, words[Word.RUN])
        self.updates_done = max(self.updates_done, words[Word.UPDATE])
        for entry in entries:
            if entry["kind"] == "run":
                self._run(entry)
            else:
                self._update(entry)

    def act_alone(self, words: list[int]) -> None:
        """While this rank waits alone (held, or at another rank's breakpoint): the runs
        up to what it knows, not the updates (their ranks agree on one step boundary;
        they wait for the next agreed one)."""
        if self.fetch is None or words[Word.RUN] <= self.runs_done:
            return
        entries = self.fetch(runs=[self.runs_done, words[Word.RUN]],
                             updates=[self.updates_done, self.updates_done])
        self.runs_done = max(self.runs_done, words[Word.RUN])
        for entry in entries:
            if entry["kind"] == "run":
                self._run(entry)

    # --- job.run ---------------------------------------------------------------------------
    def _run(self, entry: dict[str, Any]) -> None:
        ctx, seq = self.ctx, entry["seq"]
        phase, ctx.phase = ctx.phase, "run"  # job.stacks() and the hang watchdog see it
        try:
            outcome = call(entry["fn"], ctx, entry["limit"])
        finally:
            ctx.phase = phase
        ctx._report(RankEvent.RAN, seq=seq, **outcome)

    # --- job.update --------------------------------------------------------------------------
    def _update(self, entry: dict[str, Any]) -> None:
        ctx, error = self.ctx, None
        try:
            changes = tuning.plan(ctx, entry["changes"], self.batch)
        except Exception as e:  # noqa: BLE001 - refused on this rank: nobody applies it
            changes, error = [], {"rank": ctx.rank, "type": type(e).__name__, "message": str(e),
                                  "cause": True}
        if not self._everyone_can(error is None):
            error = error or {"rank": ctx.rank, "type": "Refused", "message": "another rank "
                              "refused the update"}
            ctx._report(RankEvent.UPDATED, seq=entry["seq"], step=ctx.step, error=error)
            return
        for change in changes:
            change.apply()
        ctx._report(RankEvent.UPDATED, seq=entry["seq"], step=ctx.step,
                    changes={c.key: [c.old, c.new] for c in changes})

    def _everyone_can(self, ok: bool) -> bool:
        """Whether every rank can apply the update (one MIN all-reduce): all or none do."""
        ctx = self.ctx
        if ctx.world_size == 1 or ctx._control_group is None:
            return ok
        import torch.distributed as dist

        flag = torch.tensor([int(ok)], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=ctx._control_group)
        return bool(flag.item())

    # --- what the control plane's checks need -------------------------------------------------
    def first_step(self, batch: Any) -> None:
        """After the rank's first step: tell the control plane what job.update may change."""
        if self._told:
            return
        self._told = True
        self.batch = batch_size(batch)
        ctx = self.ctx
        info = {"optimizers": tuning.optimizers_info(ctx), "batch": self.batch,
                "calls": sorted(ctx._steps.called)}
        ctx._report(RankEvent.TUNABLE, info=info)


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
        return {"error": {"rank": ctx.rank, "type": type(e).__name__, "message": str(e),
                          "traceback": "".join(traceback.format_exception(type(e), e, tb))}}
    try:
        data = cloudpickle.dumps(result)
    except Exception as e:  # noqa: BLE001
        return {"error": {"rank": ctx.rank, "type": "UnpicklableResult", "traceback": "",
                          "message": f"the function returned a {type(result).__name__}, which "
                                     f"can't be pickled ({type(e).__name__}: {e}); return plain "
                                     "data (numbers, lists, dicts, tensors)"}}
    if len(data) > limit:
        return {"error": {"rank": ctx.rank, "type": "ResultTooLarge", "traceback": "",
                          "message": f"the result is {format_bytes(len(data))} pickled, over the "
                                     f"limit of {format_bytes(limit)} (clustersdk.run-result-limit "
                                     "on the scheduler); return a summary, or raise the limit"}}
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


class LiveContext:
    """What ``job.run``'s function (and the training function) reach through ``ctx``.

    >>> def train(ctx):                                       # doctest: +SKIP
    ...     model = ctx.prepare(Net())
    ...     opt = torch.optim.AdamW(model.parameters(), lr=ctx.hparams["lr0"])
    ...     ctx.register(optimizer=opt)
    ...     for step, (x, y) in ctx.loop(ctx.shard(data, batch_size=32), steps=1000):
    ...         loss = loss_fn(model(x), y)
    ...         ctx.expose(last_batch=(x, y), loss=loss)      # for job.run to look at
    ...         loss.backward(); opt.step(); opt.zero_grad()
    >>> job.run(lambda ctx: ctx.exposed["loss"].item())      # doctest: +SKIP
    {0: 0.41, 1: 0.43}
    """

    stateful: dict[str, Any]
    _live: Live
    _shards: list[str]

    @property
    def model(self) -> torch.nn.Module | None:
        """The model ``ctx.prepare`` returned (wrapped for the strategy), or None before."""
        return self.stateful.get("model")

    @property
    def registered(self) -> Mapping[str, Any]:
        """What ``ctx.register`` got (``optimizer``, ``scheduler``...) and ``model``: read-only."""
        return types.MappingProxyType({k: v for k, v in self.stateful.items()
                                       if k not in INTERNAL and k not in self._shards})

    def expose(self, **objects: Any) -> None:
        """Make ``objects`` reachable to ``job.run``'s functions as ``ctx.exposed[name]``
        (the newest value of each name; nothing is copied or sent anywhere)."""
        self._live.exposed.update(objects)

    @property
    def exposed(self) -> Mapping[str, Any]:
        """What the training function passed to :meth:`expose`, by name: read-only."""
        return types.MappingProxyType(self._live.exposed)

    @property
    def hparams(self) -> dict[str, Any]:
        """The launch's ``hparams={...}``, as changed by ``job.update`` since. Read it where
        the value is used (each step), so that a change takes effect; it is saved in
        checkpoints and restored when the job resumes."""
        return self._live.hparams
