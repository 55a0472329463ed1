"""A Hugging Face ``TrainerCallback`` for script jobs: one line in a ``Trainer`` script.

>>> from clustersdk.integrations.huggingface import ClusterSDKCallback   # doctest: +SKIP
>>> trainer = Trainer(model, args, train_dataset=data,                      # doctest: +SKIP
...                   callbacks=[ClusterSDKCallback()])

Launched with ``cluster.launch_script`` (or ``clustersdk submit``), the script then has:

- **live charts**: every ``Trainer`` log (``loss``, ``learning_rate``, ``grad_norm``...) is
  a row of the job's history at its global step (``job.history()``, the dashboard);
- **pause**: ``job.pause()`` holds every rank before the same step (its history
  complete up to there);
- **checkpoints**: ``job.checkpoint()`` makes the ``Trainer`` save (its own format,
  ``output_dir/checkpoint-N``) after the next step; every save it makes is the job's
  newest checkpoint;
- **suspend and preemption**: the ``Trainer`` saves after the next step and stops
  training; when the job comes back the script resumes from its own checkpoint as Hugging
  Face's example scripts do,
  ``trainer.train(resume_from_checkpoint=get_last_checkpoint(args.output_dir))``, and
  continues at the same global step.

Outside a clustersdk job (plain ``python`` or ``torchrun``) the callback does nothing.
See :mod:`clustersdk.script` for what happens underneath.
"""

from __future__ import annotations

import numbers
import os
from typing import Any

from transformers import TrainerCallback

from .. import script


class ClusterSDKCallback(TrainerCallback):
    """Charts, pause, checkpoint and suspend of a clustersdk job for a ``Trainer``."""

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        scalars = {k: number for k, v in (logs or {}).items() if (number := _number(v)) is not None}
        if scalars:
            script.log(step=state.global_step, **scalars)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # The boundary is before a step rather than after one: by then the Trainer has
        # logged and saved the step before (it does so after on_step_end), so a paused
        # job's history is complete. A save or a stop asked here comes after this step.
        todo = script.step(state.global_step, saves=True)  # a paused job waits here
        if todo.checkpoint:
            control.should_save = True
        if todo.stop:
            control.should_training_stop = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        script.saved(path, step=state.global_step)


def _number(value: Any) -> float | None:
    """A logged value as a number (a formatted one too), else None (text, lists...)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None
