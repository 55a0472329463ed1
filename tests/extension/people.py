"""A Jupyter identity provider with several people, each with a token of their own.

What JupyterHub or an authenticating proxy gives a shared server: each request is a
named user. Configure ``TokenPeople.tokens = {"alice-token": "alice", ...}`` and
``ServerApp.identity_provider_class`` (the browser test runs it in a JupyterLab
subprocess: ``tests.extension.people.TokenPeople``).
"""

from __future__ import annotations

from jupyter_server.auth.identity import IdentityProvider, User
from traitlets import Dict, Unicode


class TokenPeople(IdentityProvider):
    """``Authorization: token T`` (or ``?token=T``, then a login cookie) is ``tokens[T]``."""

    tokens = Dict(key_trait=Unicode(), value_trait=Unicode(), help="token -> user name").tag(
        config=True
    )

    @property
    def auth_enabled(self) -> bool:
        return True

    async def get_user_token(self, handler) -> User | None:  # noqa: ANN001 - tornado's handler
        name = self.tokens.get(self.get_token(handler) or "")
        if name is None:  # the server's own token (its tests' shutdown): as usual
            return await super().get_user_token(handler)
        return User(username=name, name=name, display_name=name)
