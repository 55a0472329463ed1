"""The scheduling settings, validated: what ``dask.config["clustersdk.scheduling"]`` holds.

:class:`PolicyConfig` is built from that plain dict (keys as in ``clustersdk.yaml``,
``-`` or ``_`` alike) and refuses a bad one with a :class:`~clustersdk.errors.SpecError`
that names the key, the bad value and what was expected. An admin change is
:meth:`PolicyConfig.updated`: the merged settings are validated as a whole, and the
old config stays in force if they are refused.

>>> config = PolicyConfig.from_dict({"queues": {"research": {"guaranteed": 8, "borrowing-limit": 8}}})
>>> config.priority("high"), config.limit("research", total=16)
(100, 16)
"""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from ...errors import SpecError

REST = "rest"  # guaranteed: rest -- the slots no other queue guarantees
_TOP_KEYS = (
    "priority-classes",
    "default-priority",
    "default-queue",
    "queues",
    "per-user-cap",
    "preemption-grace",
    "idle-timeout",
    "non-preemptible-min-priority",
    "max-time-limit",
    "checkpoint-bandwidth",
)
_QUEUE_KEYS = ("guaranteed", "borrowing-limit", "cohort", "idle-timeout")
DEFAULTS: dict[str, Any] = {
    "priority-classes": {"low": 0, "normal": 50, "high": 100},
    "default-priority": "normal",
    "default-queue": "default",
    "queues": {
        "default": {
            "guaranteed": REST,
            "borrowing-limit": None,
            "cohort": "default",
            "idle-timeout": None,
        }
    },
    "per-user-cap": None,
    "preemption-grace": 120.0,
    "idle-timeout": None,
    "non-preemptible-min-priority": "normal",
    "max-time-limit": 30 * 24 * 3600.0,
    "checkpoint-bandwidth": 1e9,
}


@dataclasses.dataclass(frozen=True)
class QueueConfig:
    """One queue: its guaranteed slots, how far past them it may borrow, who lends to it.

    ``guaranteed`` is a number of slots or ``"rest"`` (the slots no other queue
    guarantees); ``borrowing_limit`` None means no limit of its own (the idle slots
    of its cohort bound it); ``idle_timeout`` None means idle jobs are never reclaimed.
    """

    name: str
    guaranteed: int | str = 0
    borrowing_limit: int | None = None
    cohort: str = "default"
    idle_timeout: float | None = None


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """Priority classes, queues, caps and timeouts; build it with :meth:`from_dict`."""

    priority_classes: Mapping[str, int]
    default_priority: int
    default_queue: str
    queues: Mapping[str, QueueConfig]
    per_user_cap: int | None
    preemption_grace: float
    non_preemptible_min_priority: int
    max_time_limit: float
    checkpoint_bandwidth: float  # bytes/s: ranks victims by the time their save takes
    raw: Mapping[str, Any] = dataclasses.field(repr=False, compare=False, default_factory=dict)

    # building -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, settings: Mapping[str, Any] | None = None) -> PolicyConfig:
        """Validate ``settings`` (missing keys take the defaults of ``clustersdk.yaml``)."""
        raw = _merge(copy.deepcopy(DEFAULTS), _normalized(settings or {}, "clustersdk.scheduling"))
        classes = _classes(raw["priority-classes"])

        def resolve(key: str) -> int:
            return _priority(raw[key], classes, key)

        idle_default = _timeout(raw["idle-timeout"], "idle-timeout")
        queues = {name: _queue(name, spec, idle_default) for name, spec in _queues(raw["queues"])}
        rest = [q.name for q in queues.values() if q.guaranteed == REST]
        if len(rest) > 1:
            raise SpecError(
                f"at most one queue may have guaranteed: rest (the slots no other queue "
                f"guarantees); {', '.join(repr(n) for n in rest)} do"
            )
        default_queue = raw["default-queue"]
        if default_queue not in queues:
            raise SpecError(
                f"default-queue {default_queue!r} is not one of the queues "
                f"({', '.join(repr(n) for n in queues)})"
            )
        return cls(
            priority_classes=MappingProxyType(classes),
            default_priority=resolve("default-priority"),
            default_queue=default_queue,
            queues=MappingProxyType(queues),
            per_user_cap=_count(raw["per-user-cap"], "per-user-cap", minimum=1, optional=True),
            preemption_grace=_positive(raw["preemption-grace"], "preemption-grace"),
            non_preemptible_min_priority=resolve("non-preemptible-min-priority"),
            max_time_limit=_positive(raw["max-time-limit"], "max-time-limit"),
            checkpoint_bandwidth=_positive(raw["checkpoint-bandwidth"], "checkpoint-bandwidth"),
            raw=MappingProxyType(raw),
        )

    def updated(self, changes: Mapping[str, Any]) -> PolicyConfig:
        """This config with an admin's ``changes`` merged in (nested dicts merge key by key;
        a queue set to None is removed), validated as a whole before it replaces this one."""
        merged = _merge(
            copy.deepcopy(dict(self.raw)), _normalized(changes, "clustersdk.scheduling")
        )
        return PolicyConfig.from_dict(merged)

    def to_dict(self) -> dict[str, Any]:
        """The settings as a plain dict, as ``from_dict`` takes them (journal, REST)."""
        return copy.deepcopy(dict(self.raw))

    # questions the scheduler asks -----------------------------------------------------
    def priority(self, value: int | str | None) -> int:
        """A priority class name or int as an int; None is the default class."""
        if value is None:
            return self.default_priority
        return _priority(value, self.priority_classes, "priority")

    def priority_name(self, value: int) -> str:
        """``"high"`` for 100 in the default classes, else the number itself."""
        for name, number in self.priority_classes.items():
            if number == value:
                return name
        return str(value)

    def guaranteed(self, queue: str, total: int) -> int:
        """The queue's guaranteed slots on a cluster of ``total`` slots."""
        q = self.queues[queue]
        if q.guaranteed != REST:
            return int(q.guaranteed)
        others = sum(int(o.guaranteed) for o in self.queues.values() if o.guaranteed != REST)
        return max(0, total - others)

    def limit(self, queue: str, total: int) -> float:
        """The most slots the queue may hold: guaranteed + borrowing limit (inf: no limit)."""
        borrow = self.queues[queue].borrowing_limit
        return math.inf if borrow is None else self.guaranteed(queue, total) + borrow


# validation helpers ------------------------------------------------------------------
def _normalized(settings: Mapping[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(settings, Mapping):
        raise SpecError(f"{where} must be a mapping, got {type(settings).__name__}")
    out = {}
    for key, value in settings.items():
        name = str(key).replace("_", "-")
        if name not in _TOP_KEYS:
            raise SpecError(
                f"unknown scheduling setting {key!r}; expected one of {', '.join(_TOP_KEYS)}"
            )
        out[name] = value
    return out


def _merge(base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), Mapping):
            base[key] = _merge(dict(base[key]), value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def _classes(value: Any) -> dict[str, int]:
    if not isinstance(value, Mapping) or not value:
        raise SpecError(f"priority-classes must map class names to ints, got {value!r}")
    for name, number in value.items():
        if not isinstance(name, str) or not name or _is_int(name):
            raise SpecError(f"a priority class name must be a non-numeric string, got {name!r}")
        if not _is_int(number):
            raise SpecError(f"priority class {name!r} must be an int, got {number!r}")
    return {name: int(number) for name, number in value.items()}


def _priority(value: Any, classes: Mapping[str, int], key: str) -> int:
    if _is_int(value):
        return int(value)
    if isinstance(value, str) and value in classes:
        return classes[value]
    known = ", ".join(f"{n} ({v})" for n, v in classes.items())
    raise SpecError(f"unknown {key} {value!r}: expected an int or a priority class ({known})")


def _queues(value: Any) -> Iterator[tuple[str, Mapping[str, Any]]]:
    if not isinstance(value, Mapping) or not value:
        raise SpecError(f"queues must map queue names to their settings, got {value!r}")
    for name, spec in value.items():
        if spec is None:
            continue  # an admin removed the queue
        if not isinstance(name, str) or not name:
            raise SpecError(f"a queue name must be a non-empty string, got {name!r}")
        if not isinstance(spec, Mapping):
            raise SpecError(f"queue {name!r} must be a mapping of settings, got {spec!r}")
        yield name, spec


def _queue(name: str, spec: Mapping[str, Any], idle_default: float | None) -> QueueConfig:
    spec = {str(k).replace("_", "-"): v for k, v in spec.items()}
    for key in spec:
        if key not in _QUEUE_KEYS:
            raise SpecError(
                f"unknown setting {key!r} of queue {name!r}; expected one of "
                f"{', '.join(_QUEUE_KEYS)}"
            )
    guaranteed = spec.get("guaranteed", 0)
    if guaranteed != REST:
        guaranteed = _count(guaranteed, f"queues.{name}.guaranteed", minimum=0, also="or 'rest'")
    cohort = spec.get("cohort", "default")
    if not isinstance(cohort, str) or not cohort:
        raise SpecError(f"queues.{name}.cohort must be a name, got {cohort!r}")
    idle = spec.get("idle-timeout")  # None: the cluster-wide default; False: never
    idle = idle_default if idle is None else _timeout(idle, f"queues.{name}.idle-timeout")
    return QueueConfig(
        name=name,
        guaranteed=guaranteed,
        cohort=cohort,
        idle_timeout=idle,
        borrowing_limit=_count(
            spec.get("borrowing-limit"), f"queues.{name}.borrowing-limit", minimum=0, optional=True
        ),
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _count(value: Any, key: str, *, minimum: int, optional: bool = False, also: str = "") -> Any:
    if value is None and optional:
        return None
    if not _is_int(value) or value < minimum:
        none = " or null" if optional else ""
        raise SpecError(
            f"{key} must be an int of at least {minimum}{none}{also and ' ' + also}, got {value!r}"
        )
    return int(value)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _positive(value: Any, key: str) -> float:
    # (value stays Any: typeshed's numbers.Real has no __gt__)
    if not _is_real(value) or not value > 0 or math.isinf(value):
        raise SpecError(f"{key} must be a positive number, got {value!r}")
    return float(value)


def _timeout(value: Any, key: str) -> float | None:
    if value is None or value is False:
        return None
    return _positive(value, key + " (seconds, or false for never)")
