"""A nanny's part of revocation: its listener refuses revoked certificates too.

A nanny serves handlers of its own (it starts, restarts and kills its worker, and
runs functions). :class:`Revocations`, a ``NannyPlugin``, gives it the handler
through which the control plane hands it the cluster's new revocation list; the
workers' agents have theirs (:mod:`.agent`).
"""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import NannyPlugin

from ..protocol import WorkerOp
from ..security.tls import apply_crl, cluster_only


class Revocations(NannyPlugin):
    """The nanny's ``revoke`` handler (registered by ``Cluster``)."""

    name = "clustersdk-revocations"
    idempotent = True

    def setup(self, nanny: Any) -> None:
        self.nanny = nanny
        nanny.handlers[WorkerOp.REVOKE.handler] = cluster_only(nanny, "worker", self.revoke)

    def revoke(self, crl: str) -> bool:
        """Load ``crl`` into the nanny's listeners (and its revocation file)."""
        return apply_crl(self.nanny, crl) > 0
