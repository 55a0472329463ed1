"""JobSpec validation: every bad argument is refused with a message naming it."""

from __future__ import annotations

import functools
import getpass
import re
import threading

import cloudpickle
import msgpack
import pytest

from clustersdk.errors import SpecError
from clustersdk.spec import JobSpec


def train(ctx=None, lr=0.1):
    return lr


@pytest.mark.parametrize("world_size", [0, -1, 2.5, "2", True])
def test_bad_world_size_is_named(world_size):
    with pytest.raises(SpecError, match=f"world_size .*got {re.escape(repr(world_size))}"):
        JobSpec(fn=train, world_size=world_size)


def test_spec_errors_are_value_errors():
    with pytest.raises(ValueError):
        JobSpec(fn=train, world_size=0)


def test_unknown_strategy_lists_the_valid_ones():
    with pytest.raises(SpecError, match="'zero'") as info:
        JobSpec(fn=train, world_size=2, strategy="zero")
    for name in ("ddp", "fsdp", "tp", "pp", "ep", "none"):
        assert f"'{name}'" in str(info.value)


def test_fn_must_be_callable():
    with pytest.raises(SpecError, match="fn must be callable, got 'train'"):
        JobSpec(fn="train", world_size=1)


@pytest.mark.parametrize("name", ["", "-lead", ".hidden", "has space", "a/b", "a" * 65, 7])
def test_bad_names_are_refused(name):
    with pytest.raises(SpecError, match=re.escape(f"job name {name!r} is invalid")):
        JobSpec(fn=train, world_size=1, name=name)


@pytest.mark.parametrize("name", ["a", "7", "run_1.v2-b", "a" * 64])
def test_good_names_are_kept(name):
    assert JobSpec(fn=train, world_size=1, name=name).name == name


@pytest.mark.parametrize(
    "fn, base", [(train, "train"), (lambda ctx: 0, "lambda"), (functools.partial(train), "job")]
)
def test_default_name_comes_from_the_function(fn, base):
    spec = JobSpec(fn=fn, world_size=1)
    assert spec.name == f"{base}-{spec.id[:6]}"


def _make(name: str):
    namespace: dict = {}
    exec(f"def {name}(ctx): pass", namespace)
    return namespace[name]


@pytest.mark.parametrize("fn_name", ["_train", "t" * 60, "entraînement"])
def test_any_function_gets_a_valid_default_name(fn_name):
    spec = JobSpec(fn=_make(fn_name), world_size=1)
    # the name a user would have to type back: legal, short, ending in the id
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", spec.name)
    assert spec.name.endswith(f"-{spec.id[:6]}") and spec.name[0] in (fn_name.strip("_") or "j")[0]


@pytest.mark.parametrize(
    "field, value",
    [("timeout", 0), ("timeout", "5"), ("metrics_interval", -1.0), ("metrics_interval", True)],
)
def test_durations_must_be_positive_numbers(field, value):
    with pytest.raises(
        SpecError, match=f"{field} must be a positive number .*got {re.escape(repr(value))}"
    ):
        JobSpec(fn=train, world_size=1, **{field: value})


def scaled(ctx, scale, lr=0.1):
    return scale * lr


def test_payload_round_trips_function_and_arguments():
    spec = JobSpec(fn=scaled, world_size=1, args=[2.0], kwargs={"lr": 0.5})
    fn, args, kwargs, objects = cloudpickle.loads(spec.payload())
    assert args == (2.0,) and fn(None, *args, **kwargs) == 1.0 and objects == {}


def test_a_function_that_cannot_take_the_context_and_the_arguments_is_refused():
    with pytest.raises(SpecError, match=r"first parameter 'lr' has a default \(0.001\)"):
        JobSpec(fn=lambda lr=1e-3: lr, world_size=1)
    with pytest.raises(SpecError, match="takes no positional argument: write"):
        JobSpec(fn=lambda *, lr=1e-3: lr, world_size=1)
    with pytest.raises(SpecError, match="got an unexpected keyword argument 'lrr'"):
        JobSpec(fn=scaled, world_size=1, args=[1.0], kwargs={"lrr": 0.1})
    with pytest.raises(SpecError, match="missing a required argument: 'scale'"):
        JobSpec(fn=scaled, world_size=1)
    JobSpec(fn=train, world_size=1)  # a context parameter named ctx may have a default
    JobSpec(fn=lambda *args, **kwargs: None, world_size=1, args=[1], kwargs={"a": 2})


def _closure_over_lock():
    lock = threading.Lock()

    def train_with_lock(ctx):
        with lock:
            pass

    return JobSpec(fn=train_with_lock, world_size=1)


@pytest.mark.parametrize(
    "make, named",
    [
        (_closure_over_lock, "train_with_lock"),
        (lambda: JobSpec(fn=train, world_size=1, args=(threading.Lock(),)), "train"),
    ],
    ids=["closure", "argument"],
)
def test_unpicklable_payload_names_the_function(make, named):
    spec = make()
    with pytest.raises(SpecError, match=rf"training function \S*{named} .*can't be pickled"):
        spec.payload()


def test_to_wire_is_msgpackable_and_has_no_function():
    spec = JobSpec(fn=train, world_size=2, name="run", timeout=5)
    wire = spec.to_wire().as_dict()
    assert msgpack.unpackb(msgpack.packb(wire)) == wire
    assert wire == {
        "id": spec.id,
        "name": "run",
        "world_size": 2,
        "strategy": "ddp",
        "timeout": 5.0,
        "metrics_interval": 0.2,
        "fn": "train",
        "owner": getpass.getuser(),
        "checkpoint_dir": None,
        "checkpoint_every": None,
        "keep": 3,
        "async_checkpoint": True,
        "resume": None,
        "tensorboard_dir": None,
        "max_restarts": 0,
        "attempt": 0,
        "mesh": None,
        "precision": "fp32",
        "grad_accum": 1,
        "clip_grad_norm": None,
        "microbatches": None,
        "schedule": None,
        "split": None,
        "reshard_after_forward": None,
        "cpu_offload": None,
        "env": None,
        "working_dir": None,
        "py_modules": None,
        "queue": None,
        "priority": None,
        "preemptible": True,
        "time_limit": None,
        "min_world_size": None,
        "asked_world_size": None,
        "hang_timeout": None,
        "on_hang": "report",
        "profile_dir": None,
        "on_error": "fail",
        "hold_timeout": 1800.0,
        "debug": False,
        "hparams": None,
        "on_nan": "report",
        "on_spike": "report",
        "script": None,
        "module": None,
        "command": None,
        "args": None,
        "grace": 30.0,
        "skip_steps": None,
        "parent": None,
        "forked_at": None,
        "version": 1,
    }


def test_parallel_options_travel_on_the_wire_and_objects_in_the_payload():
    import torch

    plan = {"0": "colwise", "2": "rowwise"}
    spec = JobSpec(
        fn=train,
        world_size=4,
        strategy="fsdp",
        mesh={"dp": -1, "tp": 2},
        precision="bf16",
        grad_accum=2,
        clip_grad_norm=1,
        plan=plan,
        model=lambda: torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)
        ),
    )
    wire = spec.to_wire().as_dict()
    assert msgpack.unpackb(msgpack.packb(wire)) == wire
    assert (wire["mesh"], wire["precision"], wire["grad_accum"], wire["clip_grad_norm"]) == (
        {"dp": -1, "tp": 2},
        "bf16",
        2,
        1.0,
    )
    fn, _, _, objects = cloudpickle.loads(spec.payload())
    assert objects["plan"] == plan and fn.__qualname__ == "train" and callable(objects["model"])


@pytest.mark.parametrize(
    "options, match",
    [
        ({"precision": "fp8"}, "precision must be one of ('fp32', 'bf16', 'fp16'), got 'fp8'"),
        ({"grad_accum": 0}, "grad_accum must be a positive int, got 0"),
        ({"clip_grad_norm": -1.0}, "clip_grad_norm must be a positive number, got -1.0"),
        (
            {"strategy": "fsdp", "cpu_offload": "yes"},
            "cpu_offload must be True or False, got 'yes'",
        ),
        (
            {"strategy": "tp", "reshard_after_forward": False},
            "reshard_after_forward= is an option of strategy='fsdp', not 'tp'",
        ),
        ({"strategy": "fsdp", "plan": {"a": "colwise"}}, "plan= is for tensor parallelism"),
        (
            {"strategy": "pp", "schedule": "zb"},
            "schedule must be one of ('gpipe', '1f1b'), got 'zb'",
        ),
        ({"strategy": "pp", "microbatches": 0}, "microbatches must be a positive int, got 0"),
        ({"strategy": "pp", "split": "layers.1"}, "split must be a list of module names"),
        ({"strategy": "pp", "model": 3}, "model must be an nn.Module or a function returning one"),
    ],
)
def test_parallel_options_are_checked(options, match):
    with pytest.raises(SpecError, match=re.escape(match)):
        JobSpec(fn=train, world_size=2, **options)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"checkpoint_every": 10}, "checkpoint_every need checkpoint_dir"),
        ({"resume": "auto"}, "resume need checkpoint_dir"),
        (
            {"checkpoint_dir": "/tmp/x", "checkpoint_every": 0},
            "checkpoint_every must be a positive int",
        ),
        ({"checkpoint_dir": "/tmp/x", "keep": 0}, "keep must be an int of at least 1, got 0"),
        ({"checkpoint_dir": 3}, "checkpoint_dir must be a path, got 3"),
    ],
)
def test_checkpoint_options_are_checked(options, match):
    with pytest.raises(SpecError, match=match):
        JobSpec(fn=train, world_size=1, **options)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"on_error": "pause"}, "on_error must be one of 'fail', 'hold', got 'pause'"),
        ({"hold_timeout": 0}, "hold_timeout must be a positive number of seconds"),
        ({"hold_timeout": "1h"}, "got '1h'"),
        ({"debug": "yes"}, "debug must be True or False, got 'yes'"),
    ],
)
def test_debug_options_are_checked(options, match):
    with pytest.raises(SpecError, match=re.escape(match)):
        JobSpec(fn=train, world_size=1, **options)


def test_debug_options_travel_on_the_wire():
    wire = JobSpec(fn=train, world_size=1, on_error="hold", hold_timeout=60, debug=True).to_wire()
    assert (wire.on_error, wire.hold_timeout, wire.debug) == ("hold", 60.0, True)


def test_hparams_are_json_scalars_and_not_a_builtin_key_of_job_update():
    spec = JobSpec(
        fn=train,
        world_size=1,
        hparams={"warmup": 10, "smoothing": 0.1, "schedule": "cosine", "ema": True},
    )
    assert spec.to_wire().hparams == {
        "warmup": 10,
        "smoothing": 0.1,
        "schedule": "cosine",
        "ema": True,
    }
    with pytest.raises(SpecError, match=r"hparams: 'lr' is a built-in key of job.update"):
        JobSpec(fn=train, world_size=1, hparams={"lr": 0.1})
    with pytest.raises(
        SpecError,
        match=r"hparams: layers=\[1, 2\] must be a finite number, "
        "a string or a boolean",
    ):
        JobSpec(fn=train, world_size=1, hparams={"layers": [1, 2]})
    with pytest.raises(SpecError, match=r"hparams: 'a b' is not a valid name"):
        JobSpec(fn=train, world_size=1, hparams={"a b": 1})
    with pytest.raises(SpecError, match="hparams must be a dict"):
        JobSpec(fn=train, world_size=1, hparams=[("warmup", 1)])
