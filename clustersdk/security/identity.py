"""Who is asking: an :class:`Identity`, read from the certificate a TLS peer presented.

Pure: no Dask, no ``cryptography``. A certificate the cluster's authority issued
(:mod:`.pki`) names its holder in the subject's common name (CN) and its role in
the organizational unit (OU):

- ``admin``: a person who may change every job (the cluster's creator is one);
- ``user``: a person who may change their own jobs and see everyone's;
- ``scheduler``, ``worker``: the cluster's own processes (they report ranks).

>>> who = Identity.from_peercert({"subject": ((("commonName", "bob"),),
...                                          (("organizationalUnitName", "user"),)),
...                               "serialNumber": "1F"})
>>> who.name, who.role, who.serial, who.admin, who.cluster
('bob', 'user', 31, False, False)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

ADMIN, USER, SCHEDULER, WORKER = "admin", "user", "scheduler", "worker"
PEOPLE = (ADMIN, USER)
CLUSTER = (SCHEDULER, WORKER)
ROLES = PEOPLE + CLUSTER
ANONYMOUS = "anonymous"  # a peer without a certificate: only possible on plain tcp://


@dataclasses.dataclass(frozen=True)
class Identity:
    """A verified peer: its name, role (:data:`ROLES`) and certificate serial number."""

    name: str
    role: str
    serial: int | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES + (ANONYMOUS,):
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")

    @property
    def admin(self) -> bool:
        """May change every job and the cluster's settings."""
        return self.role == ADMIN

    @property
    def cluster(self) -> bool:
        """One of the cluster's own processes (a scheduler or a worker)."""
        return self.role in CLUSTER

    @property
    def anonymous(self) -> bool:
        return self.role == ANONYMOUS

    @classmethod
    def from_peercert(
        cls, cert: Mapping[str, Any] | None, own_subject: tuple[str, str] | None = None
    ) -> Identity:
        """The identity in ``ssl.SSLSocket.getpeercert()``'s answer (None: no certificate).

        A certificate without one of :data:`ROLES` in its OU (another PKI's) is a
        ``user`` named by its CN, unless its (CN, OU) is ``own_subject``, the
        scheduler's own: a PKI that gives every process one certificate (as
        ``distributed.Security.temporary()`` does) has no people, only the cluster.
        """
        if not cert:
            return cls("anonymous", ANONYMOUS)
        fields = subject_fields(cert.get("subject") or ())
        name = fields.get("commonName", "")
        unit = fields.get("organizationalUnitName", "")
        serial = cert.get("serialNumber")
        number = int(serial, 16) if isinstance(serial, str) and serial else None
        if unit in ROLES:
            role = unit
        elif own_subject is not None and (name, unit) == own_subject:
            role = SCHEDULER
        else:
            role = USER
        return cls(name or "unnamed", role, number)

    def describe(self) -> str:
        """``'bob'``, ``'alice (admin)'``, ``'the cluster (worker)'``: for messages."""
        if self.cluster:
            return f"the cluster ({self.role} {self.name!r})"
        return f"{self.name!r}" + (" (admin)" if self.admin else "")

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "admin": self.admin,
            "serial": None if self.serial is None else format(self.serial, "X"),
        }


def subject_fields(subject: Any) -> dict[str, str]:
    """``getpeercert()["subject"]`` (a tuple of RDNs, each a tuple of (key, value)) as a dict."""
    fields: dict[str, str] = {}
    for rdn in subject:
        for pair in rdn:
            if len(pair) == 2:
                fields.setdefault(str(pair[0]), str(pair[1]))
    return fields
