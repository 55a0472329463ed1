"""Authentication and authorization on every route of the extension.

No cluster is needed: a request must be refused before any scheduler is asked.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from http.cookies import SimpleCookie

import pytest
from jupyter_clustersdk.handlers import ROUTES
from jupyter_clustersdk.manager import ACTIONS
from jupyter_server.auth import Authorizer
from jupyter_server.serverapp import ServerWebApplication
from tornado import web

from .conftest import extension_config

PUBLIC = {"/clustersdk/healthz"}
_SAMPLES = {"job": "some-job", "cluster": "some-cluster", "fmt": "json"}


def requests():
    """(method, path, expected resource) for every route and method the extension serves."""
    out = []
    for pattern, handler in ROUTES:
        actions = ACTIONS if "(?P<action>" in pattern else ("",)
        for action in actions:
            path = re.sub(
                r"\(\?P<(\w+)>[^)]*\)", lambda m, action=action: _SAMPLES.get(m[1], action), pattern
            )
            path = path.replace("\\", "")
            for method in ("GET", "POST"):
                if getattr(handler, method.lower()) is not web.RequestHandler._unimplemented_method:
                    out.append((method, path, handler.auth_resource))
    return out


REQUESTS = requests()


def test_the_walk_covers_every_route_and_action():
    paths = {path for _, path, _ in REQUESTS}
    assert len(paths) == len(ROUTES) - 1 + len(ACTIONS)  # the action route once per action
    assert ("POST", "/clustersdk/api/jobs/some-job/stop", "clustersdk:jobs") in REQUESTS
    assert ("GET", "/clustersdk/metrics", "clustersdk:metrics") in REQUESTS


def test_every_method_is_decorated_for_authentication():
    """What jupyter-server itself checks when allow_unauthenticated_access is False."""
    for pattern, handler in ROUTES:
        assert ServerWebApplication._check_handler_auth(None, pattern, handler) == []


@pytest.fixture(params=[True, False], ids=["unauthenticated-allowed", "unauthenticated-denied"])
def jp_server_config(request, tmp_path):
    return extension_config(tmp_path / "none", allow_unauthenticated_access=request.param)


async def raw(http_server_client, jp_base_url, method, path, **kwargs):
    """A request without the token that jp_fetch would add."""
    url = jp_base_url.rstrip("/") + path
    body = b"" if method == "POST" else None
    return await http_server_client.fetch(
        url, method=method, body=body, raise_error=False, follow_redirects=False, **kwargs
    )


async def test_no_credentials_no_access_on_any_route(http_server_client, jp_base_url, jp_serverapp):
    assert jp_serverapp.allow_unauthenticated_access in (True, False)
    for method, path, _ in REQUESTS:
        response = await raw(http_server_client, jp_base_url, method, path)
        if path in PUBLIC:
            assert response.code == 200, (method, path)
            continue
        assert response.code == 403, (method, path, response.code)
        assert b"clustersdk_" not in response.body and b"some-job" not in response.body


async def test_healthz_is_open_and_tells_no_job_data(http_server_client, jp_base_url):
    response = await raw(http_server_client, jp_base_url, "GET", "/clustersdk/healthz")
    body = json.loads(response.body)
    assert body == {"status": "ok", "schedulers": 0, "reachable": 0}


async def test_a_wrong_token_is_refused(http_server_client, jp_base_url):
    for method, path, _ in REQUESTS:
        if path in PUBLIC:
            continue
        response = await raw(
            http_server_client,
            jp_base_url,
            method,
            path,
            headers={"Authorization": "token not-the-token"},
        )
        assert response.code == 403, (method, path)


async def test_cookie_login_needs_an_xsrf_token_to_post(
    http_server_client, jp_base_url, jp_serverapp
):
    cookies = await _login(http_server_client, jp_base_url, jp_serverapp.identity_provider.token)
    login = {k: v for k, v in cookies.items() if k != "_xsrf"}
    header = {"Cookie": "; ".join(f"{k}={v}" for k, v in login.items())}

    # a cookie is enough to read ...
    read = await raw(http_server_client, jp_base_url, "GET", "/clustersdk/api/jobs", headers=header)
    assert read.code == 200 and json.loads(read.body) == {"jobs": [], "unreachable": []}
    # ... but not to act without the XSRF token
    path = "/clustersdk/api/jobs/some-job/stop"
    refused = await raw(http_server_client, jp_base_url, "POST", path, headers=header)
    assert refused.code == 403
    # with it, the request gets through to the (absent) job
    with_xsrf = {
        "Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items()),
        "X-XSRFToken": cookies["_xsrf"],
    }
    accepted = await raw(http_server_client, jp_base_url, "POST", path, headers=with_xsrf)
    assert accepted.code == 404 and json.loads(accepted.body)["error"] == "job_not_found"


async def _login(client, base_url, token):
    page = await client.fetch(base_url + "login", raise_error=False, follow_redirects=False)
    cookies = _cookies(page)
    xsrf = cookies["_xsrf"]
    body = urllib.parse.urlencode({"password": token, "_xsrf": xsrf})
    response = await client.fetch(
        base_url + "login",
        method="POST",
        body=body,
        headers={"Cookie": f"_xsrf={xsrf}"},
        raise_error=False,
        follow_redirects=False,
    )
    assert response.code == 302, response.body
    return {**cookies, **_cookies(response)}


def _cookies(response):
    jar = SimpleCookie()
    for value in response.headers.get_list("Set-Cookie"):
        jar.load(value)
    return {k: morsel.value for k, morsel in jar.items()}


class DenyAll(Authorizer):
    """Authenticated users may do nothing; every question is recorded."""

    asked: list[tuple[str, str]] = []

    def is_authorized(self, handler, user, action, resource):
        if resource.startswith("clustersdk:"):
            DenyAll.asked.append((action, resource))
        return False


@pytest.fixture
def deny_all_config(tmp_path):
    DenyAll.asked.clear()
    return extension_config(tmp_path / "none", authorizer_class=DenyAll)


class TestDenyAll:
    @pytest.fixture
    def jp_server_config(self, deny_all_config):
        return deny_all_config

    async def test_a_deny_all_authorizer_yields_403_everywhere_but_healthz(self, jp_fetch):
        for method, path, resource in REQUESTS:
            body = b"" if method == "POST" else None
            response = await jp_fetch(path.lstrip("/"), method=method, body=body, raise_error=False)
            if path in PUBLIC:
                assert response.code == 200, path
                continue
            assert response.code == 403, (method, path, response.code)
            action = "read" if method == "GET" else "write"
            assert DenyAll.asked[-1] == (action, resource), (method, path)
