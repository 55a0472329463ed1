"""Scheduling a shared GPU cluster: pure decisions, no Dask, no torch, no I/O.

The control plane feeds a :class:`Scheduler` what happens (slots, submissions,
progress, checkpoints, releases) and carries out what :meth:`Scheduler.decide`
returns; :func:`decide` does the same from a whole :class:`ClusterState`.
Launch-time checks are :func:`admit`; the settings are a :class:`PolicyConfig`.

The rules
---------

Who and where. Every job has an owner, a queue and an int priority (classes
such as ``low``/``normal``/``high`` are resolved at launch), a world size
(``min_world_size`` lets it run on fewer) and may say ``preemptible=False``.

Order. Higher priority first, submission order within a priority. A job that
was preempted goes back in the queue with its own priority and submission
order, so it comes back ahead of the jobs submitted after it. Across queues a
guarantee comes before borrowing: the jobs that fit their queue's guarantee
are placed first, then those that would borrow (a queue keeps its own order:
behind its first borrower, the rest of it waits for that second round).

Gangs. A job starts on all the slots it asks for at once, or not at all; on as
few hosts as the free slots allow (best fit), never two ranks on one GPU.
With ``min_world_size`` it may start on fewer (the most that fit) when its
full size cannot be had even by preemption.

Quotas. A queue holds at most its guaranteed slots plus its borrowing limit.
Past its guarantee it borrows the idle guaranteed slots of queues in its
cohort (or slots no queue guarantees), never those of a queue outside its
cohort. The jobs of a queue that cannot be preempted hold at most its
guarantee together (they never borrow: a lender gets borrowed slots back by
preemption). An owner holds at most the per-user cap. A job held by a limit
waits without holding anything back. A leaving victim counts against limits
until it is gone, but its queue no longer borrows those slots.

Preemption. When a job cannot start, it may take the slots of: lower-priority
jobs of its own queue; lower-priority jobs of its owner, when it fits its own
queue's guarantee; and jobs of queues that borrow past their guarantee,
whatever their priority when its own queue stays within its guarantee (the
lender reclaims, borrowers first), else lower priorities only. Each rule keeps
the victim, once back in the queue, behind the job it made room for, so no
job is preempted twice for the same one. Never a ``preemptible=False`` job,
never a job that is already leaving, and only when the freed slots, with the
free ones, actually let the waiting job start (quotas included). Victims lose
the least work: paused or idle first, then the least GPU-seconds at risk (a
just-in-time checkpoint's write time, nothing when the newest checkpoint is
current, everything since its start without a checkpoint_dir), then the
lowest priority, then the youngest; a victim that turns out not to be needed
is spared. A victim with a checkpoint_dir is suspended (checkpoint at the
next step boundary, slots freed), one without is stopped; both go back in the
queue. A suspend that outlives the preemption grace is stopped. The slots of
leaving victims are the waiting job's, and so are the free slots of its
planned gang (reserved: nobody behind it takes them); once freed they stay its
claim until it starts (no head plans with them; only a job of a higher
priority, which could preempt it anyway, may start on them first). It starts
as soon as a whole gang is free, never on part of one.

Backfill (EASY, per queue). The first job of a queue that is blocked for want of
slots is the queue's head: it gets a reservation, the gang it will get when
running jobs end by their ``time_limit`` estimates (its estimated start; in
the past when a job outlived its estimate). A later job may take a reserved
slot only if its own ``time_limit`` ends before the head's reserved start;
other slots it may take freely. When the holders gave no estimates, the head
holds every slot as it frees up: the jobs behind it start only on slots it
cannot use, and none of them may preempt. So the head's start is never delayed
by a job behind it, and it is never starved. A head that would borrow holds
slots against the jobs after it, but does not stop another queue's own
preemptions.

Idle reclaim. A job paused, or without a finished step, for longer than its
queue's ``idle_timeout`` is suspended (or, without a checkpoint_dir and if
preemptible, stopped); it does not come back by itself: ``job.resume()``.

Admin changes (:meth:`Scheduler.configure`) never stop a running job: one over
a lowered quota finishes, or is preempted by the rules above.

How it stays fast
-----------------

A pass walks the queues merged in order and stops looking at a queue once
nothing in the pass can move the rest of it (its head is placed, too few slots
are free even by backfill, nobody there may preempt): the waits of those jobs
are worked out when read (:class:`~.waits.Waits`). Jobs that wait alike in an
unchanged state share one worked-out wait. The :class:`Scheduler` keeps the
free slots, the slots per queue and owner and the preemptible jobs counted
between passes, answers a timer tick with nothing new from its last pass, and
answers a lone arrival that only waits from its last pass when that pass had
nothing to do (see :mod:`.arrival`). A property test holds every decision of a kept Scheduler
equal to :func:`decide` from the whole state.
"""

from __future__ import annotations

from .admission import Admission, admit
from .config import REST, PolicyConfig, QueueConfig
from .gangs import FreeSlots, pick_gang, rank_order
from .model import (
    ClusterState,
    Decision,
    Holding,
    Preempt,
    Request,
    Reservation,
    Slot,
    Start,
    Wait,
)
from .scheduler import Scheduler, decide

__all__ = [
    "Admission",
    "ClusterState",
    "Decision",
    "FreeSlots",
    "Holding",
    "PolicyConfig",
    "Preempt",
    "QueueConfig",
    "REST",
    "Request",
    "Reservation",
    "Scheduler",
    "Slot",
    "Start",
    "Wait",
    "admit",
    "decide",
    "pick_gang",
    "rank_order",
]
