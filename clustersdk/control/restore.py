"""What a control plane takes over when it starts: settings and jobs of an earlier one.

A Dask scheduler that restarts (at the same address, with the same state
directory) finds in the journal the scheduling settings an admin changed at
run time, and the jobs its predecessor left QUEUED or SUSPENDED, with their
payloads: the queue is rebuilt (in its order) and a suspended job can be
resumed from its checkpoint. A job it died running (its ranks went with its
workers) restarts from its newest committed checkpoint (from the start without
one) when it has restarts left (``max_restarts``), first in the queue, as after a
lost worker; without, it is FAILED, saying why. The requests a job's ranks had not
carried out (its record's ``pending``: a pause, a checkpoint, job.update's changes)
are asked of its next gang, as after a lost worker; a job.run's function was kept
in memory only, and is gone (an event says so).
"""

from __future__ import annotations

import logging
import time

from .. import config
from ..errors import ProtocolError
from ..protocol import PHASES, WireSpec
from ..status import JobStatus
from .goodput import Goodput
from .journal import Journal
from .placement import Placement
from .plane import Plane
from .scheduling import PolicyConfig

logger = logging.getLogger(__name__)


def scheduling_config(journal: Journal) -> PolicyConfig:
    """The settings an admin set at run time, else ``clustersdk.scheduling``."""
    saved = journal.setting("scheduling")
    return PolicyConfig.from_dict(saved if saved is not None else config.get("scheduling"))


def adopt(plane: Plane, placement: Placement) -> list[str]:
    """Follow the jobs an earlier scheduler at this address left queued or suspended;
    their ids. A record that can't be taken over (no payload, another release's spec)
    is marked FAILED, saying why; so is a job the earlier scheduler died running."""
    address, adopted = plane.address, []
    for record in plane.journal.orphaned(address, plane.id):  # it died without closing them
        if _restart(plane, placement, record):
            adopted.append(record["id"])
            continue
        plane.journal.update(
            record["id"],
            scheduler=plane.id,
            status=JobStatus.FAILED.name,
            payload=None,
            reason="",
            ended=time.time(),
            error={
                "rank": None,
                "type": "SchedulerClosed",
                "traceback": "",
                "message": f"the Dask scheduler stopped while the job was {record['status']}",
            },
        )
    for record in plane.journal.adoptable(address, plane.id):
        status = JobStatus[record["status"]]
        try:
            spec = WireSpec.from_dict(record["spec"])
            if not record.get("payload"):
                raise ProtocolError("its function was not kept")
            spec = placement.admit(spec, 0)  # the settings may have changed meanwhile
        except Exception as e:  # noqa: BLE001 - one bad record must not stop the others
            plane.journal.update(
                record["id"],
                status=JobStatus.FAILED.name,
                reason="",
                error={
                    "rank": None,
                    "type": type(e).__name__,
                    "traceback": "",
                    "message": f"a restarted scheduler could not take the job over: {e}",
                },
            )
            continue
        plane.journal.update(record["id"], scheduler=plane.id)
        plane.follow(
            spec,
            record["payload"],
            seq=record.get("seq"),
            goodput=record.get("goodput"),
            status=status,
            restarts=int(record.get("restarts") or 0),
            checkpoint=record.get("checkpoint"),
            checkpoint_step=record.get("checkpoint_step"),
            pending=_pending(plane, record),
        )
        adopted.append(record["id"])
    if adopted:
        logger.info(
            "clustersdk: took over %d queued or suspended job(s) of an earlier scheduler at %s",
            len(adopted),
            address,
        )
    return adopted


def _restart(plane: Plane, placement: Placement, record: dict) -> bool:
    """Queue again (first in line) a job the earlier scheduler died running, from its
    newest committed checkpoint, when it has restarts left; False when it has none (or
    can't be taken over)."""
    try:
        spec = WireSpec.from_dict(record["spec"])
    except Exception:  # noqa: BLE001 - another release's spec: it fails, as before
        return False
    restarts = int(record.get("restarts") or 0)
    if not record.get("payload") or restarts >= spec.max_restarts:
        return False
    checkpoint, step = record.get("checkpoint"), record.get("checkpoint_step")
    spec = spec.replace(resume=checkpoint or spec.resume, attempt=spec.attempt + 1)
    try:
        spec = placement.admit(spec, 0)
    except Exception:  # noqa: BLE001 - the settings changed under it: it fails, as before
        return False
    where = f"from checkpoint {checkpoint}" if checkpoint else "from the start (no checkpoint)"
    message = (
        f"the Dask scheduler stopped while the job was {record['status']}; restart "
        f"{restarts + 1} of {spec.max_restarts}, {where}"
    )
    journal = plane.journal
    since = step if checkpoint and step is not None else 0
    goodput = Goodput(record.get("goodput"))  # the steps since its checkpoint were lost
    goodput.discard(
        [
            [r["step"], *(r[p] for p in PHASES)]
            for r in journal.phases(record["id"])
            if r["rank"] == 0 and r["step"] >= since
        ]
    )
    goodput.status(JobStatus.QUEUED.name, time.time())
    journal.truncate_history(record["id"], since)
    journal.add_event(
        record["id"], time.time(), step, "restarted", message, {"attempt": spec.attempt}
    )
    journal.update(record["id"], scheduler=plane.id, restarts=restarts + 1, spec=spec.as_dict())
    plane.follow(
        spec,
        record["payload"],
        seq=record.get("seq"),
        goodput=goodput.summary(time.time()),
        status=JobStatus.QUEUED,
        restarts=restarts + 1,
        checkpoint=checkpoint,
        checkpoint_step=step,
        pending=_pending(plane, record),
    )
    return True


def _pending(plane: Plane, record: dict) -> list[dict]:
    """The requests the job's ranks had not carried out, to ask of its next gang; a
    job.run among them is gone with the scheduler that held its function."""
    pending = list(record.get("pending") or ())
    lost = [p for p in pending if p.get("op") == "run"]
    if lost:
        plane.journal.add_event(
            record["id"],
            time.time(),
            None,
            "run_lost",
            f"{len(lost)} job.run request(s) not run yet were lost with the scheduler that "
            "held their function (#" + ", #".join(str(p.get("seq")) for p in lost) + ")",
            {"seqs": [p.get("seq") for p in lost]},
        )
    return [p for p in pending if p.get("op") != "run"]
