"""Whom a request acts as: the Jupyter user it came from, and their clustersdk credentials.

Each HTTP request runs with :data:`JUPYTER_USER` set to the user jupyter_server's
identity provider authenticated (a handler's ``prepare``). The manager then talks to
a TLS scheduler with that user's credentials (:class:`Credentials`), so the control
plane sees the person, and refuses what they may not do, whatever route they use.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Iterable, Mapping

from clustersdk import config, registry
from clustersdk.errors import AccessDeniedError

from .errors import SchedulerUnavailableError

#: the Jupyter user name of the request being served (None: the server itself)
JUPYTER_USER: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "clustersdk_jupyter_user", default=None
)


class Credentials:
    """Which credentials file a Jupyter user's requests present to a TLS scheduler.

    With a ``by_user`` map (``ClusterSDKApp.credentials``: several people on one
    server), each user has their own and a user without one is refused. Without it
    (a single-user server, as JupyterHub starts one per person), every request acts
    with this server's own: the ``clustersdk.credentials`` setting, else the
    registry's entry for the address (a cluster this account created or joined).
    What the server asks for itself (``/clustersdk/healthz``) uses its own too.
    """

    def __init__(self, by_user: Mapping[str, str] | None = None, state_dirs: Iterable[str] = ()):
        self.by_user = {u: os.path.expanduser(p) for u, p in (by_user or {}).items()}
        self.state_dirs = list(state_dirs)

    def for_address(self, address: str, cluster: str) -> str | None:
        """The file for the current request to ``address`` (None: a plain tcp:// one)."""
        if not address.startswith("tls://"):
            return None
        user = JUPYTER_USER.get()
        if self.by_user and user is not None:
            path = self.by_user.get(user or "")
            if path is None:
                raise AccessDeniedError(
                    f"Jupyter user {user!r} has no clustersdk credentials on this server, so "
                    f"cluster {cluster} refuses them: an admin makes some (`clustersdk cluster "
                    f"add-user {user}`) and maps them in ClusterSDKApp.credentials",
                    None,
                    None,
                    user,
                    "connect",
                )
            return path
        path = config.get("credentials")
        for state_dir in self.state_dirs:
            path = path or registry.credentials(address, state_dir)
        if not path:  # e.g. its creator closed it: its registry entry outlived its keys
            raise SchedulerUnavailableError(
                f"this server has no credentials for cluster {cluster} ({address}), so it "
                "cannot reach it: set DASK_CLUSTERSDK__CREDENTIALS, or ClusterSDKApp.credentials "
                "per Jupyter user"
            )
        return path
