"""Scheduling settings and launch-time admission: what is accepted, and the message a bad
value gets (it names the value and what was expected)."""

from __future__ import annotations

import doctest
import importlib
import math
from pathlib import Path

import dask.config
import pytest
import yaml

from clustersdk.control.scheduling import REST, PolicyConfig, admit
from clustersdk.control.scheduling.config import DEFAULTS
from clustersdk.errors import CapacityError, SpecError

from .helpers import config

YAML = Path(__file__).resolve().parents[2] / "clustersdk" / "clustersdk.yaml"
SHARED = {
    "research": {"guaranteed": 4, "borrowing-limit": 2},
    "solo": {"guaranteed": 2, "borrowing-limit": 8, "cohort": "own"},
}


def test_the_yaml_defaults_are_the_documented_ones_and_build_a_config():
    assert yaml.safe_load(YAML.read_text())["clustersdk"]["scheduling"] == DEFAULTS
    import clustersdk.config  # noqa: F401 -- loads the yaml into dask.config

    cfg = PolicyConfig.from_dict(dask.config.get("clustersdk.scheduling"))
    assert dict(cfg.priority_classes) == {"low": 0, "normal": 50, "high": 100}
    assert cfg.default_priority == 50 and cfg.default_queue == "default"
    assert cfg.queues["default"].guaranteed == REST and cfg.per_user_cap is None
    assert cfg.guaranteed("default", total=12) == 12 and math.isinf(cfg.limit("default", 12))
    assert cfg.queues["default"].idle_timeout is None and cfg.preemption_grace == 120


def test_priorities_resolve_from_a_class_or_an_int():
    cfg = config()
    assert (cfg.priority("high"), cfg.priority(70), cfg.priority(None)) == (100, 70, 50)
    assert (cfg.priority_name(100), cfg.priority_name(70)) == ("high", "70")


def test_a_queue_with_rest_gets_what_no_other_queue_guarantees():
    cfg = config(queues=SHARED)
    assert cfg.guaranteed("default", total=16) == 10 and cfg.limit("research", 16) == 6


def test_settings_round_trip_through_a_plain_dict():
    cfg = config(queues=SHARED, per_user_cap=8, idle_timeout=600)
    assert PolicyConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.queues["research"].idle_timeout == 600  # the cluster-wide default


def test_an_admin_update_merges_and_a_bad_one_changes_nothing():
    cfg = config(queues=SHARED)
    new = cfg.updated({"queues": {"research": {"guaranteed": 6}, "solo": None}, "per_user_cap": 4})
    assert new.queues["research"].guaranteed == 6 and new.queues["research"].borrowing_limit == 2
    assert "solo" not in new.queues and new.per_user_cap == 4
    with pytest.raises(SpecError, match="queues.research.guaranteed must be an int of at least 0"):
        cfg.updated({"queues": {"research": {"guaranteed": -1}}})
    assert cfg.queues["research"].guaranteed == 4


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {"preemption-gracee": 5},
            "unknown scheduling setting 'preemption-gracee'; expected one of",
        ),
        ({"queues": {"a": {"guaranted": 2}}}, "unknown setting 'guaranted' of queue 'a'"),
        (
            {"queues": {"a": {"guaranteed": "rest"}}},
            "at most one queue may have guaranteed: rest (the slots no other queue guarantees); "
            "'default', 'a' do",
        ),
        ({"default-queue": "gpu"}, "default-queue 'gpu' is not one of the queues ('default')"),
        (
            {"queues": {"a": {"borrowing-limit": True}}},
            "queues.a.borrowing-limit must be an int of at least 0 or null, got True",
        ),
        (
            {"queues": {"a": {"idle-timeout": 0}}},
            "queues.a.idle-timeout (seconds, or false for never) must be a positive number, got 0",
        ),
        ({"per-user-cap": 0}, "per-user-cap must be an int of at least 1 or null, got 0"),
        ({"priority-classes": {"low": "0"}}, "priority class 'low' must be an int, got '0'"),
        (
            {"default-priority": "urgent"},
            "unknown default-priority 'urgent': expected an int or a "
            "priority class (low (0), normal (50), high (100))",
        ),
        ({"preemption-grace": -1}, "preemption-grace must be a positive number, got -1"),
    ],
)
def test_bad_settings_are_refused_with_a_message_naming_them(settings, message):
    with pytest.raises(SpecError) as info:
        PolicyConfig.from_dict(settings)
    assert message in str(info.value)


# admission -----------------------------------------------------------------------------------
def _admit(**kw):
    kw.setdefault("world_size", 2)
    return admit(config(queues=SHARED, per_user_cap=8), total_slots=16, **kw)


def test_admission_resolves_queue_and_priority():
    assert _admit(queue="research", priority="high").priority == 100
    assert _admit().queue == "default" and _admit().priority_name == "normal"
    assert _admit(priority=70, preemptible=False, time_limit=3600.0).priority == 70


@pytest.mark.parametrize(
    "kw, error, message",
    [
        (
            {"queue": "gpu"},
            SpecError,
            "unknown queue 'gpu'; the queues are 'default', 'research', 'solo'",
        ),
        (
            {"priority": "urgent"},
            SpecError,
            "unknown priority 'urgent': expected an int or a priority class (low (0), normal (50), "
            "high (100))",
        ),
        ({"priority": True}, SpecError, "unknown priority True"),
        (
            {"world_size": 7, "queue": "research"},
            CapacityError,
            "world_size=7 can never fit queue 'research': it may hold at most 6 slots (4 guaranteed "
            "+ 2 borrowing limit); ask for at most 6 ranks or use another queue",
        ),
        ({"world_size": 9}, CapacityError, "world_size=9 is more than the per-user cap of 8 slots"),
        (
            {"world_size": 5, "queue": "solo"},
            CapacityError,
            "world_size=5 can never fit queue 'solo': it can hold at most 2 slots, those the queues "
            "of other cohorts than 'own' do not guarantee",
        ),
        (
            {"preemptible": False, "priority": "low"},
            SpecError,
            "preemptible=False needs priority normal (50) or higher, got low (0)",
        ),
        (
            {"preemptible": False, "world_size": 5, "queue": "research"},
            CapacityError,
            "a job with preemptible=False never borrows",
        ),
        ({"preemptible": "yes"}, SpecError, "preemptible must be True or False, got 'yes'"),
        ({"time_limit": -5}, SpecError, "time_limit must be a positive number of seconds, got -5"),
        ({"time_limit": 0}, SpecError, "time_limit must be a positive number of seconds, got 0"),
        (
            {"time_limit": float("nan")},
            SpecError,
            "time_limit must be a positive number of seconds",
        ),
        (
            {"time_limit": "2h"},
            SpecError,
            "time_limit must be a positive number of seconds, got '2h'",
        ),
        (
            {"time_limit": 1e9},
            SpecError,
            "time_limit=1000000000.0 s (11574.1 days) is more than the "
            "30.0 days this cluster accepts",
        ),
        ({"min_world_size": 3}, SpecError, "min_world_size=3 is more than world_size=2"),
        ({"world_size": 0}, SpecError, "world_size must be an int of at least 1, got 0"),
        (
            {"world_size": 17},
            CapacityError,
            "world_size=17 is more than this cluster's 16 slots; "
            "add workers or ask for fewer ranks",
        ),
    ],
)
def test_a_job_that_can_never_run_is_refused_at_launch(kw, error, message):
    with pytest.raises(error) as info:
        _admit(**kw)
    assert message in str(info.value)


def test_an_elastic_job_is_admitted_by_its_smallest_size():
    assert _admit(world_size=8, min_world_size=6, queue="research").queue == "research"


def test_the_cluster_size_check_comes_first_and_names_it():
    with pytest.raises(CapacityError, match="more than this cluster's 4 slots"):
        admit(config(), world_size=5, total_slots=4)


@pytest.mark.parametrize("module", ["admission", "config", "gangs", "scheduler"])
def test_the_examples_in_the_docstrings_run(module):
    mod = importlib.import_module(f"clustersdk.control.scheduling.{module}")
    assert doctest.testmod(mod).failed == 0
