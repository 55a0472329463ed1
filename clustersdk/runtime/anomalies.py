"""A rank's own watch for non-finite losses (``on_nan`` "pause", "rollback" or "fail"), and
what a failing rank tells of itself for a diagnosis (:func:`failure_facts`).

At the end of each step the rank reads what it logged for that step (the
watched scalars of :mod:`clustersdk.signals`: losses, ``grad_norm``)
and the gradient norm that ``clip_grad_norm`` computed. A NaN or Inf is
reported to the control plane at once (it decides, and diagnoses) and raised
in the rank's own control vector as ``Word.NONFINITE = 1 + step``; the ranks
agree on the vector at every step in these modes, so all of them act at the
next step boundary, before anything is saved there: pause, or leave the loop
(the control plane then restarts or fails the job). Under ``precision="fp16"``
an infinite gradient norm is the grad scaler's business (it skips the step),
so only the losses count.

The cost: reading the logged values (a device sync on CUDA) and one small
all-reduce on the control group per step; with ``on_nan="report"`` the ranks
pay nothing and the control plane checks the rows it receives.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..protocol import RankEvent, Word, no_words
from ..signals import nonfinite_values

if TYPE_CHECKING:
    from .control_words import Control
    from .metrics import Metrics
    from .steps import Steps

LEAVE = ("rollback", "fail")  # policies whose ranks leave ctx.loop at the agreed boundary


class NanGuard:
    """One rank's watch under its job's ``on_nan`` ``policy``.

    What it needs of its rank: ``metrics`` (the scalars logged at a step), ``steps``
    (the gradient norm of the last clipping, and the precision), ``report`` (NONFINITE
    to the control plane) and ``control`` (the rank's own control vector).
    """

    def __init__(
        self,
        policy: str,
        *,
        metrics: Metrics,
        steps: Steps,
        report: Callable[..., None],
        control: Control,
    ):
        self.policy = policy
        self.metrics, self.steps, self.report, self.control = metrics, steps, report, control

    def after_step(self, step: int) -> None:
        """Check the step just done; report and raise NONFINITE if it was not finite."""
        values = nonfinite_values({k: _number(v) for k, v in self.metrics.scalars_of(step).items()})
        norm = self.steps.take_norm()
        if norm is not None and self.steps.precision.name != "fp16":
            norm = _number(norm)
            if not math.isfinite(norm):
                values.setdefault("grad_norm", norm)
        if not values:
            return
        self.report(RankEvent.NONFINITE, step=step, values=values)
        words = no_words()
        words[Word.NONFINITE] = step + 1
        self.control.merge(words)

    def act(self, words: list[int]) -> bool:
        """At a boundary whose agreed vector carries a new NONFINITE: False to leave the
        loop; to pause, the pause is added to ``words`` (and to the rank's own vector)."""
        if self.policy in LEAVE:
            return False
        held = no_words()
        held[Word.PAUSE] = words[Word.RESUME] + 1
        self.control.merge(held)
        words[Word.PAUSE] = max(words[Word.PAUSE], held[Word.PAUSE])
        return True


def _number(value: Any) -> Any:
    return value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value


def failure_facts(exc: BaseException, device: torch.device | None) -> dict[str, Any] | None:
    """What a failing rank adds to its error record for a diagnosis: on CUDA, an out of
    memory error's peak allocated and reserved memory and the device's total."""
    if device is None or device.type != "cuda":
        return None
    if not (isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc)):
        return None
    try:
        return {
            "memory": {
                "device": str(device),
                "max_allocated": int(torch.cuda.max_memory_allocated(device)),
                "max_reserved": int(torch.cuda.max_memory_reserved(device)),
                "total": int(torch.cuda.get_device_properties(device).total_memory),
            }
        }
    except Exception:  # a broken CUDA context: the error says enough
        return None
