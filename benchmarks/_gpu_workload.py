"""What ``gpu_check.py`` runs: training functions for clustersdk jobs and the plain loops
they are compared with.

The ``*_job`` functions are launched on the cluster (pickled by value: Dask workers
can't import ``benchmarks/``); the ``plain_*`` functions run in one plain Python
process on the same device, outside clustersdk (:func:`serve`, driven through a
pipe by :class:`gpu_check.PlainRunner`). Each pair shares its model, data and step,
so that the only difference is clustersdk's loop around them.

On a machine without CUDA (``--rehearse``) the same functions run on the CPU with
small sizes; the few steps that only a GPU can take have stand-ins, named where
they are.
"""

from __future__ import annotations

import os
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

GIB = 1 << 30


# --- shared pieces ---------------------------------------------------------------------------
def device_of(ctx: Any = None) -> torch.device:
    """The rank's device, or cuda:0 / cpu in the plain process."""
    if ctx is not None:
        return ctx.device
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def sync(device: torch.device) -> None:
    """Wait for the device: host clocks then bracket finished GPU work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peaks(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peaks(device: torch.device) -> dict[str, float | None]:
    """Peak allocated and reserved memory since :func:`reset_peaks`, GiB (None on CPU)."""
    if device.type != "cuda":
        return {"peak_allocated_gib": None, "peak_reserved_gib": None}
    return {
        "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB,
        "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB,
    }


# --- nccl: the reference transformer under each layout, against one plain loop -----------------
def lm_data(data_cfg: dict[str, int]) -> Any:
    from clustersdk import models

    return models.SyntheticText(**data_cfg)


def lm_optimizer(params: Any, lr: float, steps: int, warmup: int) -> tuple[Any, Any]:
    import clustersdk as cs

    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    return opt, cs.warmup_cosine(opt, warmup=warmup, total=steps)


def lm_job(
    ctx: Any,
    model_cfg: dict[str, int],
    data_cfg: dict[str, int],
    steps: int,
    batch: int,
    lr: float,
    warmup: int,
    wrap_ddp: bool = False,
) -> dict[str, Any]:
    """The reference transformer through ``ctx.prepare`` and ``ctx.train_step`` (or, with
    ``wrap_ddp``, under clustersdk's fixed-bucket DDP even at one rank, stepped by hand).

    Returns rank 0's losses, what the job ran on, and one all-reduce on the default group.
    """
    import torch.distributed as dist

    from clustersdk import models

    device = ctx.device
    net = models.Transformer(models.TransformerConfig(**model_cfg))
    if wrap_ddp:
        from clustersdk.runtime.strategies.ddp import distributed

        model = distributed(net.to(device), device)
    else:
        model = ctx.prepare(net, loss_fn=models.lm_loss)
    opt, sched = lm_optimizer(model.parameters(), lr, steps, warmup)
    ctx.register(optimizer=opt, scheduler=sched)
    losses, times = [], []
    for _step, (x, y) in ctx.loop(ctx.shard(lm_data(data_cfg), batch_size=batch), steps=steps):
        t0 = time.perf_counter()
        if wrap_ddp:
            loss = models.lm_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            loss = ctx.train_step(opt, x, y)
        sched.step()
        ctx.log(loss=loss)
        losses.append(loss.detach())
        sync(device)
        times.append(time.perf_counter() - t0)
    probe = torch.ones(1, device=device)
    dist.all_reduce(probe)
    return {
        "losses": [float(v) for v in losses],
        "backend": dist.get_backend(),
        "device": str(device),
        "model_type": type(model).__name__,
        "param_type": type(next(model.parameters())).__name__,
        "param_device": str(_local(next(model.parameters())).device),
        "allreduce": float(probe.item()),
        "world_size": ctx.world_size,
        "torch_threads": torch.get_num_threads(),
        "step_ms": 1e3 * statistics.median(times[1:] or times),
    }


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def plain_lm(
    model_cfg: dict[str, int],
    data_cfg: dict[str, int],
    steps: int,
    batch: int,
    lr: float,
    warmup: int,
) -> dict[str, Any]:
    """The same model, data order and step in one process on one device: what every
    layout must reproduce (the loader's seeded permutation, ``seed=0``)."""
    from clustersdk import models

    device = device_of()
    data = lm_data(data_cfg)
    model = models.Transformer(models.TransformerConfig(**model_cfg)).to(device)
    opt, sched = lm_optimizer(model.parameters(), lr, steps, warmup)
    n, losses, times = len(data), [], []
    per_epoch = n // batch
    for step in range(steps):
        epoch, b = divmod(step, per_epoch)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(epoch)).tolist()
        x, y = (t.to(device) for t in data[perm[b * batch : (b + 1) * batch]])
        t0 = time.perf_counter()
        loss = models.lm_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        losses.append(loss.detach())
        sync(device)
        times.append(time.perf_counter() - t0)
    return {
        "losses": [float(v) for v in losses],
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "step_ms": 1e3 * statistics.median(times[1:] or times),
    }


# --- duplicate GPU -----------------------------------------------------------------------------
def pair_job(ctx: Any, standin: str | None = None) -> dict[str, Any]:
    """Two ranks; on one GPU NCCL refuses them as the process group comes up, before
    this runs. ``standin`` (rehearsal, gloo on CPU): raise that message instead."""
    import torch.distributed as dist

    if standin:
        raise RuntimeError(standin)
    probe = torch.ones(1, device=ctx.device)
    dist.all_reduce(probe)
    return {
        "backend": dist.get_backend(),
        "allreduce": float(probe.item()),
        "device": str(ctx.device),
    }


def raw_nccl_rank(rank: int, port: int, out: Any) -> None:
    """One of two plain processes that both put an NCCL rank on cuda:0 (no clustersdk):
    NCCL's own words, for the classifier. ``out`` is a multiprocessing queue."""
    import datetime

    import torch.distributed as dist

    os.environ["NCCL_DEBUG"] = "WARN"  # NCCL's own line on stderr too
    try:
        store = dist.TCPStore(
            "127.0.0.1", port, 2, is_master=rank == 0, timeout=datetime.timedelta(seconds=60)
        )
        torch.cuda.set_device(0)
        dist.init_process_group(
            "nccl",
            store=store,
            rank=rank,
            world_size=2,
            timeout=datetime.timedelta(seconds=60),
            device_id=torch.device("cuda", 0),
        )
        probe = torch.ones(1, device="cuda")
        dist.all_reduce(probe)
        torch.cuda.synchronize()
        out.put({"rank": rank, "ok": True, "allreduce": float(probe.item())})
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - the error is the measurement
        out.put(
            {
                "rank": rank,
                "ok": False,
                "type": type(e).__name__,
                "message": str(e),
                "traceback": traceback.format_exc(),
            }
        )


# --- telemetry -------------------------------------------------------------------------------
def telemetry_job(ctx: Any, phases: list[dict[str, Any]], size: int) -> dict[str, Any]:
    """Hold the device in known states for known times: each phase names its length
    (``seconds``), its duty cycle (``busy``: 0 idle, 1 always computing, in 0.1 s
    periods) and the extra memory it holds (``hold_gib``). Returns when each phase
    began and ended (wall clock, as the samples' times)."""
    device = ctx.device
    a, b, c = (torch.randn(size, size, device=device, dtype=_work_dtype(device)) for _ in range(3))
    todo, marks = list(phases), []
    phase: dict[str, Any] | None = None
    held: torch.Tensor | None = None
    began = 0.0
    for _ in ctx.loop(None, steps=10**9):
        if phase is None or time.time() - began >= phase["seconds"]:
            if phase is not None:
                marks.append({**phase, "began": began, "ended": time.time()})
            if not todo:
                break
            phase, held = todo.pop(0), None
            if device.type == "cuda":
                torch.cuda.empty_cache()  # freed memory leaves the device, as NVML sees it
            if phase["hold_gib"]:
                held = torch.ones(int(phase["hold_gib"] * GIB), dtype=torch.uint8, device=device)
            sync(device)
            began = time.time()
        t0 = time.time()
        while time.time() - t0 < 0.1 * phase["busy"]:
            for _ in range(4):
                torch.matmul(a, b, out=c)
            sync(device)
        time.sleep(max(0.0, 0.1 - (time.time() - t0)))
        ctx.log(busy=float(phase["busy"]))
    del held
    return {"marks": marks, "device": str(device), "pid": os.getpid()}


def _work_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


# --- bf16: GPT-2 through clustersdk and in a plain loop --------------------------------------
def gpt2_config(cfg: dict[str, Any]) -> Any:
    from transformers import GPT2Config

    last = cfg["vocab_size"] - 1  # GPT-2's end-of-text token, inside a smaller vocabulary
    return GPT2Config(
        **{"bos_token_id": min(50256, last), "eos_token_id": min(50256, last), **cfg},
        use_cache=False,
    )


def build_lm(cfg: dict[str, Any], device: torch.device) -> tuple[torch.nn.Module, int]:
    """GPT-2 (transformers; no download) or, where transformers is missing, the project's
    reference transformer at the same sizes. Built on the device, seeded."""
    torch.manual_seed(0)
    try:
        from transformers import GPT2LMHeadModel
    except ImportError:
        from clustersdk import models

        with torch.device(device):
            model = models.Transformer(
                vocab=cfg["vocab_size"],
                d_model=cfg["n_embd"],
                n_heads=cfg["n_head"],
                n_layers=cfg["n_layer"],
                seq_len=cfg["n_positions"],
            )
        return model, sum(p.numel() for p in model.parameters())
    with torch.device(device):
        model = GPT2LMHeadModel(gpt2_config(cfg))
    return model, sum(p.numel() for p in model.parameters())


def lm_logits_loss(output: Any, target: torch.Tensor) -> torch.Tensor:
    logits = output.logits if hasattr(output, "logits") else output
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


class Tokens(torch.utils.data.Dataset):
    """``n`` random token sequences (inputs and next-token targets), seeded."""

    def __init__(self, n: int, seq_len: int, vocab: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab, (n, seq_len + 1), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: Any) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.data[i]
        return row[..., :-1], row[..., 1:]


def gpt2_job(
    ctx: Any, cfg: dict[str, Any], batch: int, warmup: int, steps: int, resident: bool = False
) -> dict[str, Any]:
    """GPT-2 with ``ctx.prepare`` + ``ctx.train_step`` (the launch's ``precision``), fed by
    ``ctx.shard`` (or, ``resident``, by one batch kept on the device: the loop alone)."""
    device = ctx.device
    reset_peaks(device)
    model, n_params = build_lm(cfg, device)
    model = ctx.prepare(model, loss_fn=lm_logits_loss)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    total = warmup + steps
    data = Tokens(batch * total, cfg["n_positions"], cfg["vocab_size"])
    if resident:
        x, y = (t.to(device) for t in data[list(range(batch))])
        batches: Any = None
    else:
        batches = ctx.shard(data, batch_size=batch)
    t0 = t1 = 0.0
    loss = None
    for step, batch_xy in ctx.loop(batches, steps=total):
        if step == warmup:
            sync(device)
            t0 = time.perf_counter()
        if not resident:
            x, y = batch_xy
        loss = ctx.train_step(opt, x, y)
        ctx.log(loss=loss)
    sync(device)
    t1 = time.perf_counter()
    return {
        "steps_per_s": steps / (t1 - t0),
        "params": n_params,
        "loss": float(loss.detach()) if loss is not None else None,
        **peaks(device),
    }


def plain_gpt2(
    cfg: dict[str, Any],
    batch: int,
    warmup: int,
    steps: int,
    precision: str = "bf16",
    pinned: bool = True,
) -> dict[str, Any]:
    """The same model, data and AdamW in a plain loop: ``torch.autocast`` for ``bf16``, a
    ``DataLoader`` with pinned memory and non-blocking copies (the usual good loop)."""
    device = device_of()
    reset_peaks(device)
    model, n_params = build_lm(cfg, device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    total = warmup + steps
    data = Tokens(batch * total, cfg["n_positions"], cfg["vocab_size"])
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=batch,
        shuffle=True,
        pin_memory=pinned and device.type == "cuda",
        generator=torch.Generator().manual_seed(0),
    )
    dtype = {"bf16": torch.bfloat16, "fp32": None}[precision]
    t0 = 0.0
    loss = None
    for step, (x, y) in enumerate(loader):
        if step == warmup:
            sync(device)
            t0 = time.perf_counter()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = lm_logits_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync(device)
    t1 = time.perf_counter()
    return {
        "steps_per_s": steps / (t1 - t0),
        "params": n_params,
        "loss": float(loss.detach()) if loss is not None else None,
        **peaks(device),
    }


# --- checkpoints -----------------------------------------------------------------------------
def ckpt_job(
    ctx: Any, width: int, depth: int, batch: int, steps: int, step_s: float = 0.0
) -> dict[str, Any]:
    """A stack of square layers with AdamW on the device, one synced step at a time, each
    lasting at least ``step_s`` (a real step's length: an async save then has the time to
    finish before the next one); the start of every step (``ctx.loop``'s checkpoint
    boundaries fall between two), and how long the first step took to come (a resumed job
    restores the checkpoint there)."""
    device = ctx.device
    torch.manual_seed(0)
    with torch.device(device):
        layers: list[torch.nn.Module] = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        net = torch.nn.Sequential(*layers[:-1])
    model = ctx.prepare(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ctx.register(optimizer=opt)
    x = torch.randn(batch, width, device=device)
    starts: list[float] = []
    works: list[float] = []  # each step's own time, before it sleeps the rest of step_s
    sync(device)
    called = time.perf_counter()
    first = None
    for step, _ in ctx.loop(None, steps=steps):
        sync(device)
        starts.append(time.perf_counter())
        if first is None:
            first = step
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ctx.log(loss=loss)
        sync(device)
        works.append(time.perf_counter() - starts[-1])
        time.sleep(max(0.0, step_s - works[-1]))
    state = sum(p.numel() * p.element_size() for p in model.parameters())
    state += sum(
        t.numel() * t.element_size()
        for s in opt.state.values()
        for t in s.values()
        if isinstance(t, torch.Tensor)
    )
    return {
        "first": first,
        "starts": starts,
        "works": works,
        "first_step_after_s": starts[0] - called if starts else None,
        "state_bytes": state,
        "device": str(device),
    }


# --- CUDA out of memory ----------------------------------------------------------------------
def oom_job(ctx: Any, first_gib: float, standin_bytes: int | None = None) -> None:
    """Hold ``first_gib`` (this job's peak), then ask for more than the device has: one
    plain allocation (``torch.empty``), never managed memory. On the CPU (rehearsal) the
    ask is ``standin_bytes`` of host memory, which fails at once as well."""
    device = ctx.device
    held = torch.ones(int(first_gib * GIB), dtype=torch.uint8, device=device)
    if device.type == "cuda":
        beyond = torch.cuda.get_device_properties(device).total_memory + GIB
    else:
        beyond = int(standin_bytes or 1 << 48)
    print(f"holding {held.numel() / GIB:.2f} GiB; now asking for {beyond / GIB:.1f} GiB")
    torch.empty(beyond, dtype=torch.uint8, device=device)


def small_job(ctx: Any) -> dict[str, Any]:
    """A few steps of real work, after a failure on the same worker."""
    device = ctx.device
    a = torch.randn(512, 512, device=device)
    for _ in ctx.loop(None, steps=5):
        a = (a @ a).div_(512**0.5)
        ctx.log(norm=a.norm())
    return {
        "finite": bool(torch.isfinite(a).all()),
        "device": str(device),
        "allocated_gib": (
            torch.cuda.memory_allocated(device) / GIB if device.type == "cuda" else None
        ),
    }


# --- rank processes: a warm launch, a fatal CUDA error, NCCL's watchdog --------------------------
def first_step_job(ctx: Any) -> float:
    """One DDP step of a small model on the rank's device (NCCL on CUDA); when it was done
    (``time.time()``, comparable with the launching process's clock)."""
    return first_step(ctx.prepare, ctx.device)


def first_step(wrap: Callable[[torch.nn.Module], torch.nn.Module], device: torch.device) -> float:
    torch.manual_seed(0)
    model = wrap(
        torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
        ).to(device)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256, device=device), torch.randint(0, 10, (64,), device=device)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    sync(device)
    return time.time()


def first_step_torchrun(out: str) -> None:
    """The same step under torchrun (``python -m torch.distributed.run ... first_step OUT``)."""
    import json

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else None
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    done = first_step(
        lambda m: DistributedDataParallel(m, device_ids=[device] if cuda else None),
        device or torch.device("cpu"),
    )
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"first_step": done}, f)
    dist.destroy_process_group()


def device_assert_job(ctx: Any) -> None:
    """An index past a tensor's end on the GPU: a device-side assert, which poisons the
    process's CUDA context for good. On the CPU (rehearsal) the rank raises CUDA's message."""
    device = ctx.device
    table = torch.zeros(4, device=device)
    for _ in ctx.loop(None, steps=3):
        if device.type != "cuda":
            raise RuntimeError(
                "CUDA error: device-side assert triggered\nCUDA kernel errors might be "
                "asynchronously reported at some other API call (rehearsal stand-in)"
            )
        index = torch.tensor([7], device=device)
        table[index].sum().item()  # the kernel asserts; the error comes at this sync


def watchdog_job(ctx: Any, stall_s: float) -> None:
    """A collective that cannot finish within the job's ``timeout=``: the GPU is kept busy
    for ``stall_s`` (``torch.cuda._sleep``) and an all-reduce is queued behind it, so NCCL's
    watchdog times it out and aborts the process. On the CPU (rehearsal) the rank writes
    the watchdog's line and aborts itself."""
    import sys

    import torch.distributed as dist

    device = ctx.device
    for _ in ctx.loop(None, steps=2):
        pass
    if device.type != "cuda":
        print(
            "[rank0]:[E ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
            "Timeout(ms)=5000) ran for 5001 milliseconds before timing out. (rehearsal)",
            file=sys.stderr,
            flush=True,
        )
        os.abort()
    rate = torch.cuda.get_device_properties(device).clock_rate  # kHz
    torch.cuda._sleep(int(stall_s * rate * 1000))  # spins the GPU's stream
    value = torch.ones(1, device=device)
    dist.all_reduce(value)  # queued behind the spin: never done within the timeout
    value.item()


# --- the plain process -----------------------------------------------------------------------
PLAIN: dict[str, Callable[..., dict[str, Any]]] = {"plain_lm": plain_lm, "plain_gpt2": plain_gpt2}


def serve(conn: Any, threads: int | None = None) -> None:
    """The plain process's loop: ``(name, kwargs)`` in, ``("ok", result)`` or
    ``("error", traceback)`` out, until ``None``. Its cached device memory is given back
    after each call, so that it does not show in the next section's figures."""
    if threads:
        torch.set_num_threads(threads)
    conn.send(
        (
            "ready",
            {
                "pid": os.getpid(),
                "cuda": torch.cuda.is_available(),
                "torch_threads": torch.get_num_threads(),
            },
        )
    )
    while True:
        message = conn.recv()
        if message is None:
            break
        name, kwargs = message
        try:
            conn.send(("ok", PLAIN[name](**kwargs)))
        except BaseException:  # noqa: BLE001 - the caller reports it
            conn.send(("error", traceback.format_exc()))
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
