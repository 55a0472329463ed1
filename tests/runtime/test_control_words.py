"""Control words at step boundaries: every rank acts on the same vector at the same step,
also when the loop's checks overlap their all-reduce with the steps that follow (fast
steps checked every few steps, or steps of up to OVERLAP_STEP checked at each one)."""

from __future__ import annotations

import os
import time

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from clustersdk.protocol import Word, no_words
from clustersdk.runtime.control_words import OVERLAP_STEP, Control, ControlCheck

from ..helpers import free_port

WORLD = 3
FAST_S = 0.002  # fast steps: checks come every ~20 steps, overlapped


def _rank(
    rank: int, port: int, raiser: int, synchronous: bool, step_s: float, raised_at: int, out: dict
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        control = Control()
        check = ControlCheck(control, 0, WORLD, dist.new_group(backend="gloo"))
        checks, spacing, stopped_at = [], [], None
        for step in range(2000):
            if step == raised_at and rank == raiser:
                stop = no_words()
                stop[Word.STOP] = 1
                control.merge(stop)
            if check.due(step):
                words = check.agree(step) if synchronous else check.boundary(step)
                checks.append(step)
                spacing.append(check.every)
                if words[Word.STOP]:
                    stopped_at = step
                    break
            time.sleep(step_s)
        check.settle()
        out[rank] = (stopped_at, max(spacing[1:]), checks)  # the first: measured on no step
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "raiser, synchronous, step_s, raised_at",
    [
        (1, False, FAST_S, 120),
        (2, True, FAST_S, 120),
        (1, False, OVERLAP_STEP / 2, 6),
        (2, False, OVERLAP_STEP * 1.5, 4),
    ],
    ids=["fast-overlapped", "fast-synchronous", "short-overlapped", "slow-synchronous"],
)
def test_every_rank_stops_at_the_same_step_soon_after_one_rank_hears(
    raiser, synchronous, step_s, raised_at
):
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(
            _rank,
            args=(free_port(), raiser, synchronous, step_s, raised_at, out),
            nprocs=WORLD,
            join=True,
        )
        results = dict(out)
    assert len(results) == WORLD
    stopped, every, checks = results[0]
    for other in results.values():  # the same checks, and the stop at the same step
        assert other[0] == stopped and other[2] == checks, results
    if step_s == FAST_S:
        assert every > 1, "steps this fast should be checked every few steps"
    else:
        assert every == 1 and checks == list(range(len(checks))), checks
    assert stopped is not None
    # synchronous (called so, or slow steps): at the first check from the step it was
    # raised; overlapped: one check later
    later = [step for step in checks if step >= raised_at]
    overlapped = not synchronous and step_s <= OVERLAP_STEP
    assert stopped == later[1 if overlapped else 0], (stopped, checks)
