"""The exception tree: messages a user can act on, and errors that cross the wire whole."""

from __future__ import annotations

import ast
import builtins
import importlib
import pickle
from pathlib import Path
from typing import Any

import pytest

from clustersdk.errors import (
    AccessDeniedError,
    CapacityError,
    CheckpointError,
    ClusterClosedError,
    ClusterSDKError,
    HostKeyError,
    JobFailedError,
    JobNotFoundError,
    JobStoppedError,
    JobTimeoutError,
    PluginMissingError,
    ProtocolError,
    RunError,
    SpecError,
    StartError,
)
from clustersdk.status import JobStatus, check_transition

TRACEBACK = 'Traceback (most recent call last):\n  File "train.py", line 3, in train\n'
ROOT = Path(__file__).resolve().parents[1]
# the packages whose exception classes must pickle: the SDK and its server extension
PACKAGES = {
    "clustersdk": ROOT / "clustersdk",
    "jupyter_clustersdk": ROOT / "extension/jupyter_clustersdk",
}


def test_job_failed_error_names_rank_type_message_and_traceback():
    error = JobFailedError("train-1", 3, "ZeroDivisionError", "division by zero", TRACEBACK)
    text = str(error)
    assert "job 'train-1' failed: rank 3 raised ZeroDivisionError: division by zero" in text
    assert text.endswith(f"Remote traceback (rank 3):\n{TRACEBACK}")
    assert (error.rank, error.exc_type, error.message, error.traceback) == (
        3,
        "ZeroDivisionError",
        "division by zero",
        TRACEBACK,
    )


def test_job_failed_error_from_a_journal_record():
    record = {"rank": 0, "type": "KeyError", "message": "'x'", "traceback": TRACEBACK}
    error = JobFailedError.from_record("j", record)
    assert (error.job, error.rank, error.exc_type) == ("j", 0, "KeyError")
    assert isinstance(error, ClusterSDKError)


def test_job_not_found_message_is_not_quoted_like_a_key_error():
    assert str(JobNotFoundError("no job named 'x'")) == "no job named 'x'"
    assert isinstance(JobNotFoundError("x"), KeyError)


def test_spec_error_is_a_value_error():
    assert issubclass(SpecError, ValueError) and issubclass(SpecError, ClusterSDKError)


def test_cluster_closed_error_is_a_runtime_error_of_the_tree():
    assert issubclass(ClusterClosedError, RuntimeError)
    assert issubclass(ClusterClosedError, ClusterSDKError)


# --- every exception class pickles --------------------------------------------------------
def _refused_transition() -> BaseException:
    """What the control plane raises for a pause of a finished job (and sends pickled)."""
    try:
        check_transition("train-1", JobStatus.FINISHED, JobStatus.PAUSED)
    except ClusterSDKError as e:
        return e
    raise AssertionError("a finished job was let pause")


def _examples() -> dict[str, BaseException]:
    """Each exception class (module:qualname) -> one built by its own constructor, with
    arguments like those the code raises it with."""
    from jupyter_clustersdk import errors as ext

    from clustersdk.cells import RemoteFailure, RemoteRunFailure
    from clustersdk.control.scheduling.slot_holds import GiveUp
    from clustersdk.hooks import HookMissingError
    from clustersdk.runtime import holds
    from clustersdk.runtime.cloud import PollError
    from clustersdk.runtime.control_words import JobStopped, JobSuspended
    from clustersdk.runtime.inside import ReportRefused
    from clustersdk.runtime.zygote import ZygoteGone
    from clustersdk.security.tls import InsecureClusterWarning
    from clustersdk.standing.record import RecordError

    failed = JobFailedError(
        "train-1",
        1,
        "OutOfMemoryError",
        "CUDA out of memory. Tried to allocate 2.00 GiB",
        TRACEBACK,
        consequences=[{"rank": 0, "type": "DistBackendError", "message": "peer gone"}],
        diagnosis={
            "kind": "cuda_oom",
            "summary": "CUDA out of memory on rank 1",
            "advice": "lower the batch size, or use strategy='fsdp'",
            "rank": 1,
        },
        where="host 10.0.0.2, GPU 3",
    )
    failed.add_note("seen by the lab panel")
    run = RunError(
        "train-1",
        {0: 1.5},
        {1: {"type": "ValueError", "message": "no", "traceback": TRACEBACK}},
    )
    built = [
        ClusterSDKError("something went wrong"),
        SpecError("world_size must be a positive integer, got 0"),
        CapacityError("the job asks for 8 slots, but the cluster can ever hold 2"),
        PluginMissingError("the scheduler at tcp://10.0.0.5:8786 runs no clustersdk plane"),
        ProtocolError("the scheduler speaks protocol 3, this client 4"),
        ClusterClosedError("the Cluster is closed: start a new one", "tcp://10.0.0.5:8786"),
        JobNotFoundError("no job named 'x' on this cluster; known jobs: a"),
        _refused_transition(),
        AccessDeniedError(
            "'bob' may not stop job 'a': it is 'alice''s", "a", "alice", "bob", "stop"
        ),
        JobTimeoutError("job 'a' is still RUNNING after 5 s; it keeps running"),
        JobStoppedError("job 'a' was stopped before it returned a result"),
        CheckpointError("checkpoint step-40 can't be loaded: missing shard 1; step-30 is kept"),
        StartError("node2: ssh: connect to host node2 port 22: Connection refused", "node2"),
        HostKeyError("node2's host key is not in known_hosts: check it, then add it", "node2"),
        run,
        failed,
        RemoteFailure(failed),
        RemoteRunFailure(run),
        GiveUp(),
        HookMissingError("no tier provides the hook 'job_display'"),
        JobSuspended(),
        JobStopped(),
        holds._Deadline(),
        ReportRefused("the control plane refused the rank's report: job 'a' is gone"),
        ZygoteGone("the zygote of worker tcp://127.0.0.1:4000 died (exit code -9)"),
        InsecureClusterWarning("tcp://10.0.0.5:8786 is not encrypted"),
        RecordError("a standing cluster's name is 1-40 lower-case letters; got 'Team A'"),
        PollError("spot/instance-action answered HTTP 500"),
        ext.BadRequestError("since must be an integer >= 0, got 'x'"),
        ext.ClusterNotFoundError("no cluster 'c9' (known: c1)"),
        ext.UpstreamError("the scheduler at tcp://10.0.0.5:8786 answered an error"),
        ext.SchedulerUnavailableError("tcp://10.0.0.5:8786 did not answer within 10 s"),
        ext.UnsupportedOperationError("the scheduler's clustersdk has no 'stacks' operation"),
    ]
    return {_name(type(e)): e for e in built}


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _defined_exception_classes() -> set[str]:
    """Every exception class the packages define (module:qualname), found in their source
    (so that a new one is listed without being named here) and checked by importing it."""
    known = {n for n, v in vars(builtins).items() if isinstance(v, type)}
    known = {n for n in known if issubclass(getattr(builtins, n), BaseException)}
    classes = []  # (module, class node, base names)
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            if "labextension" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            module = ".".join([package, *parts]).removesuffix(".__init__")
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    bases = [getattr(b, "id", getattr(b, "attr", "")) for b in node.bases]
                    top = node in tree.body
                    classes.append((module, node.name, bases, top))
    found: set[tuple[str, str, bool]] = set()
    while True:  # a class whose base is an exception is one: HostKeyError(StartError)
        new = {
            (m, name, top)
            for m, name, bases, top in classes
            if any(b in known or b.endswith(("Error", "Exception", "Warning")) for b in bases)
        }
        if new <= found:
            break
        found |= new
        known |= {name for _, name, _ in new}
    nested = [f"{m}:{name}" for m, name, top in found if not top]
    assert not nested, f"define these at module level, or they can't be unpickled: {nested}"
    names = set()
    for module, name, _ in found:
        cls = getattr(importlib.import_module(module), name)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            names.add(_name(cls))
    return names


def _fields(value: Any) -> Any:
    """What a user sees of an error: its type, message, args and attributes (nested errors
    and diagnoses compared by what they hold)."""
    if isinstance(value, BaseException):
        attrs = {k: _fields(v) for k, v in vars(value).items()}
        return (type(value), str(value), _fields(value.args), attrs)
    if isinstance(value, (list, tuple)):
        return type(value)(_fields(v) for v in value)
    if isinstance(value, dict):
        return {k: _fields(v) for k, v in value.items()}
    return value


def test_every_exception_class_has_an_example_below():
    missing = _defined_exception_classes() - set(_examples())
    assert not missing, f"add an example of each to _examples(), so that it is pickled: {missing}"


@pytest.mark.parametrize("name", sorted(_examples()))
def test_every_exception_pickles_with_its_message_and_fields(name):
    error = _examples()[name]
    copy = pickle.loads(pickle.dumps(error))
    assert _fields(copy) == _fields(error)


def test_a_failed_jobs_error_comes_back_with_its_diagnosis_and_note():
    error = _examples()[_name(JobFailedError)]
    copy = pickle.loads(pickle.dumps(error))
    assert copy.diagnosis == error.diagnosis and copy.diagnosis.kind == "cuda_oom"
    assert copy.where == "host 10.0.0.2, GPU 3" and copy.consequences[0]["rank"] == 0
    assert "Diagnosis: CUDA out of memory on rank 1" in str(copy)
    assert copy.__notes__ == ["seen by the lab panel"]
    run = pickle.loads(pickle.dumps(_examples()[_name(RunError)]))
    assert (run.job, run.results, sorted(run.errors)) == ("train-1", {0: 1.5}, [1])
