"""What a person does to a job, one verb at every door: ``job.VERB()``, ``clustersdk VERB
JOB``, ``%job VERB NAME``, ``POST .../jobs/{job}/VERB`` and a dashboard's button.

:data:`JOB_ACTIONS` is the table. The CLI makes its job commands from it, the server
extension its action route and which actions wait for the ranks, the notebook and lab
dashboards their buttons and the states that enable them; each verb is the control
operation (:class:`clustersdk.protocol.Op`) and the :class:`~clustersdk.client.ControlClient`
coroutine of that name (``tests/test_actions.py`` checks ``Job``, the REST API's
description and the lab extension's list against it). Pure: no Dask, no torch.

>>> [a.verb for a in JOB_ACTIONS if a.waits]
['pause', 'checkpoint', 'suspend']
"""

from __future__ import annotations

import dataclasses

# QUEUED and STARTING: a pause, checkpoint or suspend is taken at the first step boundary
_EARLY_TO_PAUSED = frozenset({"QUEUED", "STARTING", "RUNNING", "PAUSED"})


@dataclasses.dataclass(frozen=True)
class JobAction:
    """One verb: its help line (the CLI's; the REST route's summary says the same), the
    states in which it makes sense (the rest grey its button out), whether it returns
    only once every rank did it (and so takes a timeout), and whether the dashboards
    show a button for it."""

    verb: str
    help: str
    states: frozenset[str]
    waits: bool = False
    button: bool = True


JOB_ACTIONS: tuple[JobAction, ...] = (
    JobAction(
        "pause",
        "hold every rank at the next step boundary",
        frozenset({"QUEUED", "STARTING", "RUNNING"}),
        waits=True,
    ),
    JobAction(
        "resume",
        "continue a paused job, or queue a suspended one again",
        frozenset({"PAUSED", "SUSPENDED"}),
    ),
    JobAction("checkpoint", "checkpoint at the next step boundary", _EARLY_TO_PAUSED, waits=True),
    JobAction(
        "suspend", "checkpoint, free the slots, wait for resume", _EARLY_TO_PAUSED, waits=True
    ),
    JobAction(
        "stop",
        "stop at the next step boundary (or dequeue)",
        frozenset(
            {
                "QUEUED",
                "STARTING",
                "RUNNING",
                "PAUSED",
                "HUNG",
                "RESTARTING",
                "SUSPENDING",
                "SUSPENDED",
                "HELD",
            }
        ),
    ),
    JobAction(
        "restart",
        "end a HELD job's hold: it continues from its newest checkpoint",
        frozenset({"HELD"}),
        button=False,
    ),
)
BY_VERB: dict[str, JobAction] = {a.verb: a for a in JOB_ACTIONS}
VERBS: tuple[str, ...] = tuple(BY_VERB)
WAITING: tuple[str, ...] = tuple(a.verb for a in JOB_ACTIONS if a.waits)
#: verb -> the states that enable its button, for the actions with one
BUTTONS: dict[str, frozenset[str]] = {a.verb: a.states for a in JOB_ACTIONS if a.button}
