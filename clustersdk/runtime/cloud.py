"""Spot and preemptible VM notices: the cloud says this VM goes away at time T.

Each worker's agent runs a :class:`Poller` (``clustersdk.cloud-notices``): every few
seconds it asks the VM's metadata endpoint, and when the provider announces the VM's
end it tells the scheduler once (``Op.NOTICE``), as a SIGTERM would: the job there
checkpoints at its next step boundary and moves, and the slot takes no new ranks. The
worker itself stays until the VM goes.

Each provider speaks its own protocol and reads the endpoint through a ``fetch``
function (method, path, headers -> status, body), so it is tested against any HTTP
server:

- :class:`AWS`: IMDSv2, a session token (``PUT /latest/api/token``), then
  ``/latest/meta-data/spot/instance-action``: 404 until a spot interruption, then
  ``{"action": "terminate"|"stop"|"hibernate", "time": "2026-12-07T20:22:00Z"}``
  (a rebalance recommendation is advice, not a notice, and is not read);
- :class:`GCP`: ``/computeMetadata/v1/instance/preempted`` says ``TRUE`` once the VM
  is preempted, which leaves it about :data:`GCP_NOTICE_S` seconds;
- :class:`Azure`: ``/metadata/scheduledevents``, whose ``Preempt`` or ``Terminate``
  events name the VMs they end and when (``NotBefore``).

``provider: auto`` picks the cloud that the VM's firmware names (DMI, read from
``/sys``: no request is made to find out) and polls nothing elsewhere.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import email.utils
import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from .. import config
from ..errors import SpecError

logger = logging.getLogger(__name__)

Fetch = Callable[[str, str, Mapping[str, str]], tuple[int, bytes]]

TIMEOUT_S = 2.0  # one request: the endpoint is on the VM's own link, or absent
GCP_NOTICE_S = 30.0  # what Compute Engine gives a preempted VM between notice and stop
AWS_TOKEN_TTL_S = 21600  # IMDSv2 session tokens live up to six hours
AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"  # Azure's VMs, not Hyper-V elsewhere
MAX_BODY = 1 << 20


class PollError(Exception):
    """The endpoint answered, but not as its provider's protocol says."""


@dataclasses.dataclass(frozen=True)
class Notice:
    """The VM goes away at ``at`` (seconds since the epoch); ``why`` says who said so."""

    at: float
    why: str


class Provider(Protocol):
    name: str
    base: str  # the metadata endpoint, unless ``url`` names another

    def check(self, fetch: Fetch, now: float) -> Notice | None:
        """The notice the endpoint gives now, or None; :class:`PollError` or
        ``OSError`` when it can't be read."""


class AWS:
    """EC2 spot interruptions, through IMDSv2 (a session token, then the notice)."""

    name = "aws"
    base = "http://169.254.169.254"

    def __init__(self) -> None:
        self._token: bytes | None = None
        self._token_until = 0.0

    def check(self, fetch: Fetch, now: float) -> Notice | None:
        status, body = fetch(
            "GET",
            "/latest/meta-data/spot/instance-action",
            {"X-aws-ec2-metadata-token": self._session(fetch, now).decode()},
        )
        if status == 404:
            return None
        if status == 401:  # the token expired early (the VM was stopped and started)
            self._token = None
        if status != 200:
            raise PollError(f"spot/instance-action answered HTTP {status}")
        try:
            data = json.loads(body)
            action = str(data["action"])
            at = datetime.datetime.fromisoformat(str(data["time"]).replace("Z", "+00:00"))
        except (ValueError, KeyError, TypeError) as e:
            raise PollError(f"spot/instance-action said {body[:200]!r}: {e}") from None
        at = at if at.tzinfo else at.replace(tzinfo=datetime.timezone.utc)
        return Notice(at.timestamp(), f"AWS spot interruption ({action} at {_clock(at)})")

    def _session(self, fetch: Fetch, now: float) -> bytes:
        if self._token is None or now >= self._token_until:
            status, body = fetch(
                "PUT",
                "/latest/api/token",
                {"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)},
            )
            if status != 200 or not body.strip():
                raise PollError(f"the IMDSv2 token request answered HTTP {status}")
            self._token, self._token_until = body.strip(), now + AWS_TOKEN_TTL_S - 60
        return self._token


class GCP:
    """Compute Engine preemption (spot and preemptible VMs)."""

    name = "gcp"
    base = "http://metadata.google.internal"

    def check(self, fetch: Fetch, now: float) -> Notice | None:
        # plain polling: ?wait_for_change=true would hold a thread in a request the
        # worker's close could not end
        status, body = fetch(
            "GET", "/computeMetadata/v1/instance/preempted", {"Metadata-Flavor": "Google"}
        )
        if status != 200:
            raise PollError(f"instance/preempted answered HTTP {status}")
        said = body.strip().upper()
        if said == b"FALSE":
            return None
        if said != b"TRUE":
            raise PollError(f"instance/preempted said {body[:200]!r}, not TRUE or FALSE")
        at = now + GCP_NOTICE_S
        return Notice(at, f"GCP preemption (stop at about {_clock(_utc(at))})")


class Azure:
    """Azure scheduled events that end this VM: ``Preempt`` (spot eviction), ``Terminate``."""

    name = "azure"
    base = "http://169.254.169.254"
    ENDING = ("Preempt", "Terminate")

    def __init__(self) -> None:
        self._vm: str | None = None

    def check(self, fetch: Fetch, now: float) -> Notice | None:
        headers = {"Metadata": "true"}
        if self._vm is None:
            status, body = fetch(
                "GET", "/metadata/instance/compute/name?api-version=2021-02-01&format=text", headers
            )
            if status != 200 or not body.strip():
                raise PollError(f"instance/compute/name answered HTTP {status}")
            self._vm = body.strip().decode()
        status, body = fetch("GET", "/metadata/scheduledevents?api-version=2020-07-01", headers)
        if status != 200:
            raise PollError(f"scheduledevents answered HTTP {status}")
        try:
            events = json.loads(body)["Events"]
            mine = [
                (e["EventType"], e.get("NotBefore") or "")
                for e in events
                if e["EventType"] in self.ENDING and self._vm in e.get("Resources", [])
            ]
            # NotBefore is empty once the event has started: it ends the VM now
            ends = [
                (email.utils.parsedate_to_datetime(when).timestamp() if when else now, kind)
                for kind, when in mine
            ]
        except (ValueError, KeyError, TypeError) as e:
            raise PollError(f"scheduledevents said {body[:200]!r}: {e}") from None
        if not ends:
            return None
        at, kind = min(ends)
        return Notice(at, f"Azure {kind} event (not before {_clock(_utc(at))})")


PROVIDERS: dict[str, type[Provider]] = {"aws": AWS, "gcp": GCP, "azure": Azure}
CHOICES = ("auto", "off", *PROVIDERS)


@dataclasses.dataclass(frozen=True)
class Settings:
    """``clustersdk.cloud-notices``: which ``provider`` (or ``auto``, ``off``), the
    endpoint's base ``url`` (None: the provider's own), and the poll ``interval``.

    >>> Settings("aws", url="http://127.0.0.1:8080", interval=1).provider
    'aws'
    """

    provider: str = "auto"
    url: str | None = None
    interval: float = 5.0

    def __post_init__(self) -> None:
        if self.provider not in CHOICES:
            raise SpecError(
                f"clustersdk.cloud-notices.provider {self.provider!r} is not one of "
                f"{', '.join(CHOICES)}"
            )
        if self.url is not None and self.provider in ("auto", "off"):
            raise SpecError(
                f"clustersdk.cloud-notices.url {self.url!r} needs a named provider "
                f"({', '.join(PROVIDERS)}), not {self.provider!r}"
            )
        if not (isinstance(self.interval, (int, float)) and self.interval > 0):
            raise SpecError(
                f"clustersdk.cloud-notices.interval {self.interval!r} is not a positive "
                "number of seconds"
            )

    @classmethod
    def from_config(cls) -> Settings:
        raw = dict(config.get("cloud-notices") or {})
        if raw.get("provider") is False:  # YAML 1.1 reads a bare `off` as false
            raw["provider"] = "off"
        unknown = set(raw) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise SpecError(
                f"clustersdk.cloud-notices has no setting {', '.join(sorted(map(repr, unknown)))}; "
                "it has provider, url and interval"
            )
        return cls(**raw)

    def provider_here(self, dmi: str = "/sys/class/dmi/id") -> Provider | None:
        """The provider to poll on this VM, or None (off, or no cloud found)."""
        name = detect(dmi) if self.provider == "auto" else self.provider
        return None if name in (None, "off") else PROVIDERS[name]()


def detect(dmi: str = "/sys/class/dmi/id") -> str | None:
    """The cloud whose VM this is, as its firmware says (DMI), or None."""

    def read(name: str) -> str:
        try:
            with open(os.path.join(dmi, name)) as f:
                return f.read().strip()
        except OSError:
            return ""

    vendors = {read("sys_vendor"), read("board_vendor")}
    if "Amazon EC2" in vendors:
        return "aws"
    if "Google" in vendors or read("product_name") == "Google Compute Engine":
        return "gcp"
    if "Microsoft Corporation" in vendors and read("chassis_asset_tag") == AZURE_ASSET_TAG:
        return "azure"
    return None


def http_fetch(base: str, user_agent: str, timeout: float = TIMEOUT_S) -> Fetch:
    """``fetch`` over HTTP to ``base``, never through a proxy (the endpoint is the VM's
    own); a status that is not 2xx is returned, not raised."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def fetch(method: str, path: str, headers: Mapping[str, str]) -> tuple[int, bytes]:
        request = urllib.request.Request(
            base.rstrip("/") + path,
            method=method,
            headers={"User-Agent": user_agent, **headers},
        )
        try:
            with opener.open(request, timeout=timeout) as response:
                return response.status, response.read(MAX_BODY)
        except urllib.error.HTTPError as e:
            with e:
                return e.code, e.read(MAX_BODY)

    return fetch


class Poller:
    """Asks ``provider`` every ``interval`` seconds, on the running event loop (each
    request in a thread), and hands the first notice to ``send``; done once ``send``
    returned. A poll that fails is logged once, not every time, until one succeeds."""

    def __init__(
        self,
        provider: Provider,
        fetch: Fetch,
        interval: float,
        send: Callable[[Notice], Awaitable[Any]],
    ):
        self.provider, self.fetch, self.interval, self.send = provider, fetch, interval, send
        self.notice: Notice | None = None  # the one sent
        self._failing = False
        self._task = asyncio.ensure_future(self._run())

    @classmethod
    def from_config(
        cls, send: Callable[[Notice], Awaitable[Any]], user_agent: str
    ) -> Poller | None:
        """The poller ``clustersdk.cloud-notices`` asks for here, or None."""
        settings = Settings.from_config()
        provider = settings.provider_here()
        if provider is None:
            return None
        fetch = http_fetch(settings.url or provider.base, user_agent)
        logger.info(
            "clustersdk: polling %s for %s notices every %s s",
            settings.url or provider.base,
            provider.name,
            settings.interval,
        )
        return cls(provider, fetch, float(settings.interval), send)

    def stop(self) -> None:
        self._task.cancel()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                notice = await loop.run_in_executor(
                    None, self.provider.check, self.fetch, time.time()
                )
            except Exception as e:  # noqa: BLE001 - unreadable now; the next poll may do
                self._failed(e)
            else:
                self._recovered()
                if notice is not None and await self._sent(notice):
                    return
            await asyncio.sleep(self.interval)

    async def _sent(self, notice: Notice) -> bool:
        try:
            await self.send(notice)
        except Exception as e:  # noqa: BLE001 - the scheduler away a moment: next poll
            logger.warning("clustersdk: could not pass on %s (%r); trying again", notice.why, e)
            return False
        self.notice = notice
        return True

    def _failed(self, error: Exception) -> None:
        if not self._failing:
            logger.warning(
                "clustersdk: could not read %s's preemption notices (%s: %s); trying again "
                "every %s s, quietly",
                self.provider.name,
                type(error).__name__,
                error,
                self.interval,
            )
        self._failing = True

    def _recovered(self) -> None:
        if self._failing:
            logger.warning("clustersdk: %s's preemption notices read again", self.provider.name)
        self._failing = False


def _utc(at: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc)


def _clock(at: datetime.datetime) -> str:
    return at.astimezone(datetime.timezone.utc).strftime("%H:%M:%S UTC")
