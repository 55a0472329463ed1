"""Who may do what on the control plane: one small rule object, pure.

Every request's identity is the certificate of the TLS connection it came on
(:class:`~clustersdk.security.identity.Identity`), never a name the client sends.
The rules, by what an operation does (:data:`KINDS`):

- ``view``: the cluster, the queue, every job's record: anyone with credentials.
- ``metrics``: a job's history, logs, system samples, phases, stacks: anyone, unless
  ``hide_metrics`` (then its owner and admins).
- ``submit``: launch a job, owned by whoever asked.
- ``change``: pause, resume, checkpoint, suspend, stop, restart, update, profile,
  ``job.run``, a debugger's console, a held rank's locals: the job's owner or an admin.
- ``admin``: the scheduling settings, revocations: admins.
- ``cluster``: what ranks and workers report: the cluster's own certificates.

The cluster's own processes (scheduler and worker certificates) may do everything:
code inside a job runs as the cluster (see the README's threat model). On a
cluster without TLS (``security=False``) nothing is enforced: there is no identity.
Revoked certificates are refused whatever they ask, also on a connection opened
before the revocation.

>>> from clustersdk.security.identity import Identity
>>> rules = Access(enforced=True)
>>> rules.check(Op.STOP, Identity("bob", "user", 7), Job("4f1c", "a", "alice"))
Traceback (most recent call last):
...
clustersdk.errors.AccessDeniedError: 'bob' may not stop job 'a' (id 4f1c): it belongs to 'alice'; only its owner or an admin may change it
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ..errors import AccessDeniedError
from ..protocol import EXIT_TOPIC, HANDLER_PREFIX, TOPIC_PREFIX, Op
from ..security.identity import Identity

VIEW, METRICS, SUBMIT, CHANGE, ADMIN, CLUSTER = (
    "view",
    "metrics",
    "submit",
    "change",
    "admin",
    "cluster",
)

#: what each operation of the control plane does (every Op is here: a test pins it)
KINDS: dict[Op, str] = {
    Op.INVENTORY: VIEW,
    Op.JOB: VIEW,
    Op.JOBS: VIEW,
    Op.WAIT: VIEW,
    Op.QUEUE: VIEW,
    Op.WHOAMI: VIEW,
    Op.CLUSTER_EVENTS: VIEW,
    Op.HISTORY: METRICS,
    Op.LOGS: METRICS,
    Op.SYSTEM: METRICS,
    Op.PHASES: METRICS,
    Op.STEPS: METRICS,
    Op.STACKS: METRICS,
    Op.SUBMIT: SUBMIT,
    Op.STOP: CHANGE,
    Op.PAUSE: CHANGE,
    Op.RESUME: CHANGE,
    Op.CHECKPOINT: CHANGE,
    Op.SUSPEND: CHANGE,
    Op.RESTART: CHANGE,
    Op.UPDATE: CHANGE,
    Op.FORK: CHANGE,  # it checkpoints the job: its owner's (or an admin's) call
    Op.RUN: CHANGE,
    Op.RUN_WAIT: CHANGE,
    Op.PROFILE: CHANGE,
    Op.PROFILE_WAIT: CHANGE,
    Op.DEBUG: CHANGE,
    Op.CONSOLE: CHANGE,
    Op.CONFIGURE: ADMIN,
    Op.REVOKE: ADMIN,
    Op.DRAIN: ADMIN,
    Op.UNDRAIN: ADMIN,
    Op.SET_CAPACITY: ADMIN,  # an autoscaling deployer: the creator's own client
    Op.WORKER_READY: CLUSTER,
    Op.RANK_EVENT: CLUSTER,
    Op.LIVE_PENDING: CLUSTER,
    Op.NOTICE: CLUSTER,
}

#: the requests that change a job, journaled with who made them (``job.events()``); reading
#: results and post-mortems, and each line typed into a debugger's console, are not
JOURNALED = frozenset(op for op, kind in KINDS.items() if kind == CHANGE) - {
    Op.RUN_WAIT,
    Op.PROFILE_WAIT,
    Op.DEBUG,
    Op.CONSOLE,
}

#: Dask's own scheduler handlers that run code in the scheduler process, reconfigure
#: the cluster or stop its workers: admins (and the cluster) only
DASK_ADMIN = frozenset(
    {
        "run_function",  # client.run_on_scheduler
        "feed",  # runs pickled functions in the scheduler
        "update-graph",  # unpickles a task graph in the scheduler
        "register_scheduler_plugin",
        "unregister_scheduler_plugin",
        "register_worker_plugin",
        "unregister_worker_plugin",
        "register_nanny_plugin",
        "unregister_nanny_plugin",
        "dump_cluster_state_to_url",  # writes wherever the scheduler may
        "terminate",
        "restart",
        "restart_workers",
        "retire_workers",  # every job would end
    }
)
#: handlers only the cluster's own processes call (a user must not pose as a worker)
DASK_CLUSTER = frozenset({"register-worker", "register_nanny", "unregister", "heartbeat_worker"})


@dataclasses.dataclass(frozen=True)
class Job:
    """What the rules need of a job: its id, name and owner."""

    id: str
    name: str
    owner: str | None


class Access:
    """The rules of one control plane (``enforced``: it listens on TLS)."""

    def __init__(self, *, enforced: bool, hide_metrics: bool = False, revoked: Iterable[int] = ()):
        self.enforced = enforced
        self.hide_metrics = hide_metrics
        self.revoked: frozenset[int] = frozenset(revoked)

    def revoke(self, serials: Iterable[int]) -> None:
        """Refuse these certificates from now on (the whole revocation list)."""
        self.revoked = frozenset(serials)

    # --- the control plane's operations ----------------------------------------------------
    def needs_job(self, op: Op) -> bool:
        """Whether :meth:`check` needs the job (its owner) to decide ``op``."""
        kind = KINDS[op]
        return self.enforced and (kind == CHANGE or (kind == METRICS and self.hide_metrics))

    def check(self, op: Op, who: Identity, job: Job | None = None) -> None:
        """Return if ``who`` may do ``op`` (to ``job``), else raise
        :class:`~clustersdk.errors.AccessDeniedError` saying who asked what of whose job."""
        if not self.enforced:
            return
        self._known(who, op.value)
        kind = KINDS[op]
        if who.cluster or kind in (VIEW, SUBMIT):
            return
        if kind == CLUSTER:
            raise AccessDeniedError(
                f"{who.describe()} may not send {op.value!r}: only the cluster's own "
                f"workers and scheduler report that",
                None,
                None,
                who.name,
                op.value,
            )
        if kind == ADMIN:
            if not who.admin:
                raise AccessDeniedError(
                    f"{who.describe()} may not {_verb(op)}: only an admin may",
                    None,
                    None,
                    who.name,
                    op.value,
                )
            return
        if kind == METRICS and not self.hide_metrics:
            return
        if job is None or self.may_change(who, job.owner):
            return
        what = "see the metrics of" if kind == METRICS else _verb(op)
        rule = (
            "only its owner or an admin may see them"
            if kind == METRICS
            else "only its owner or an admin may change it"
        )
        raise AccessDeniedError(
            f"{who.describe()} may not {what} job {job.name!r} (id {job.id}): it belongs to "
            f"{job.owner!r}; {rule}",
            job.name,
            job.owner,
            who.name,
            op.value,
        )

    def may_change(self, who: Identity, owner: str | None) -> bool:
        """Whether ``who`` may change a job of ``owner`` (what the panels grey out)."""
        return may_change(who, owner, enforced=self.enforced, revoked=self.revoked)

    def may_see_metrics(self, who: Identity, owner: str | None) -> bool:
        return not self.hide_metrics or self.may_change(who, owner)

    # --- Dask's own handlers -------------------------------------------------------------
    def check_dask(self, handler: str, who: Identity) -> None:
        """For one of Dask's scheduler handlers (:data:`DASK_ADMIN`, :data:`DASK_CLUSTER`)."""
        if not self.enforced:
            return
        self._known(who, handler)
        if who.cluster or (who.admin and handler in DASK_ADMIN):
            return
        if handler in DASK_ADMIN or handler in DASK_CLUSTER:
            whom = "an admin" if handler in DASK_ADMIN else "the cluster's own processes"
            raise AccessDeniedError(
                f"{who.describe()} may not call the scheduler's {handler!r}: only {whom} may "
                f"(it runs code in the scheduler, or reconfigures or stops the cluster)",
                None,
                None,
                who.name,
                handler,
            )

    def check_forward(self, handler: str, op: str, who: Identity) -> None:
        """``broadcast`` / ``proxy``: the scheduler would send ``op`` to workers as itself;
        a person may not reach the workers' clustersdk handlers (or a topic's messages)
        that way."""
        if not self.enforced or who.cluster or who.admin:
            return
        if str(op).startswith(HANDLER_PREFIX):
            raise AccessDeniedError(
                f"{who.describe()} may not send {op!r} to workers through the scheduler's "
                f"{handler!r}: only the control plane does",
                None,
                None,
                who.name,
                handler,
            )

    def check_topic(self, topic: str, who: Identity) -> None:
        """Publishing on a job's topic (``log_event``): what dashboards show as the job's
        own messages; the cluster's processes alone write there."""
        if self.enforced and not who.cluster and str(topic).startswith((TOPIC_PREFIX, EXIT_TOPIC)):
            self._known(who, "log_event")
            raise AccessDeniedError(
                f"{who.describe()} may not publish on {topic!r}: only the job's ranks and "
                f"the control plane do",
                None,
                None,
                who.name,
                "log_event",
            )

    def _known(self, who: Identity, what: str) -> None:
        if who.serial is not None and who.serial in self.revoked:
            raise AccessDeniedError(
                f"the certificate of {who.name!r} (serial {who.serial:X}) was revoked: "
                f"{what!r} refused",
                None,
                None,
                who.name,
                what,
            )


def may_change(
    who: Identity,
    owner: str | None,
    *,
    enforced: bool = True,
    revoked: frozenset[int] = frozenset(),
) -> bool:
    """Whether ``who`` may change a job owned by ``owner``: its owner, an admin or the
    cluster (everyone, where nothing is enforced)."""
    if not enforced:
        return True
    if who.serial is not None and who.serial in revoked:
        return False
    return who.cluster or who.admin or (owner is not None and who.name == owner)


def refusal(who: Identity, owner: str | None) -> str | None:
    """Why ``who`` may not change a job of ``owner`` (None: it may): the tooltip of a
    greyed-out button."""
    if may_change(who, owner):
        return None
    return (
        f"this job belongs to {owner!r}; only its owner or an admin may change it "
        f"(you are {who.name!r})"
    )


def _verb(op: Op) -> str:
    return {
        Op.RUN: "run code in (job.run)",
        Op.RUN_WAIT: "read the job.run results of",
        Op.UPDATE: "update",
        Op.RESTART: "restart",
        Op.PROFILE: "profile",
        Op.PROFILE_WAIT: "read the profile of",
        Op.DEBUG: "debug",
        Op.CONSOLE: "use the debugger console of",
        Op.CONFIGURE: "change the scheduling settings",
        Op.REVOKE: "revoke credentials",
        Op.DRAIN: "drain hosts of",
        Op.UNDRAIN: "undrain hosts of",
        Op.SET_CAPACITY: "set the cluster's capacity",
    }.get(op, op.value)
