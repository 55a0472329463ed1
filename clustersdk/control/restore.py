"""What a control plane takes over when it starts: settings and jobs of an earlier one.

A Dask scheduler that restarts (at the same address, with the same state
directory) finds in the journal the scheduling settings an admin changed at
run time, and the jobs its predecessor left QUEUED or SUSPENDED, with their
payloads: the queue is rebuilt (in its order) and a suspended job can be
resumed from its checkpoint.
"""

from __future__ import annotations

import logging
import time

from .. import config
from ..errors import ProtocolError
from ..protocol import WireSpec
from ..status import JobStatus
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
            status=status,
            restarts=int(record.get("restarts") or 0),
            checkpoint=record.get("checkpoint"),
            checkpoint_step=record.get("checkpoint_step"),
        )
        adopted.append(record["id"])
    if adopted:
        logger.info(
            "clustersdk: took over %d queued or suspended job(s) of an earlier scheduler at %s",
            len(adopted),
            address,
        )
    return adopted
