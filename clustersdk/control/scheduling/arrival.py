"""One arrival, decided on the pass before it instead of a whole new pass.

When the previous decision had nothing to carry out and only a submission came
since, a whole pass would see, up to the new job's place in the order, exactly
what the previous one saw, if the new job sorts after the last job whose
placement changed anything and no deadline fell in between (a victim's grace,
an idle timeout). Then placing the new job on the
state the previous pass ended in is that whole pass, as long as the job only
waits; anything more (a start, which changes the limits the jobs after it meet, a
preemption search, becoming a queue's head) gives up and the caller runs the
whole pass. A property test holds the result equal to ``decide(state)``.
"""

from __future__ import annotations

from .model import Decision, Request
from .planner import GiveUp, Pass


def valid_until(p: Pass) -> float:
    """Until when ``p``'s end state stands for a new pass: the first deadline after it
    (a victim's grace, an idle timeout). Plans do not move with the clock otherwise:
    they use estimates as they are, and time only takes backfill chances away."""
    until = p.idle_until
    for h in p.leaving:
        if h.status == "suspending" and h.interrupted_at is not None:
            until = min(until, h.interrupted_at + p.grace)
    return until


def arrive(p: Pass, req: Request, now: float, until: float) -> Decision | None:
    """The decision a whole pass would make at ``now`` for ``req`` just submitted, or
    None when only a whole pass can tell (``until``: from :func:`valid_until`)."""
    if not p.now <= now < until:
        return None
    # Its round: two if its queue's round one stopped before it; else it depends on the
    # state at its place in round one, which is the end state only past the last change.
    stopped = req.queue in p.stopped_at and p.stopped_at[req.queue] < req.key
    round_, key = p.last_change or (1, ())
    if stopped:
        if round_ == 2 and req.key <= key:
            return None
    elif round_ == 2 or req.key <= key:
        return None
    p.now, p.decision, p.waiting = now, Decision(), dict(p.waiting)
    if p.settled(req.queue, req):
        p.skipped = p.skipped + [[req]]
    else:
        p.fast = True
        try:
            p.visit(req)
        except GiveUp:
            return None
        finally:
            p.fast = False
    return p.finish()
