"""The environment of a rank's process: the worker's own, the job's ``env``, torchrun's.

Every rank, of a function job or of a script, runs in a process of its own with the
variables torchrun gives each worker process (:func:`torchrun_environ`), so that library
code that reads ``RANK``, ``LOCAL_RANK`` or ``WORLD_SIZE`` works in a training function
as it does in a script. On top of the worker's environment come the job's ``env`` and,
unless the job or the worker set them, the socket interface towards rank 0 for gloo and
NCCL (:mod:`clustersdk.network`: they authenticate nobody, so they listen only there;
for a loopback rank 0, on the loopback interface).

Plain standard library and :mod:`clustersdk.network`: the worker computes it, the
rank's process just takes it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from .. import network
from ..protocol import WireSpec

# what a rank's process is given on top of torchrun's variables
ENV_CONTROL = "CLUSTERSDK_CONTROL"  # a script's line to its rank (clustersdk.script)
ENV_JOB = "CLUSTERSDK_JOB"
ENV_CHECKPOINT_DIR = "CLUSTERSDK_CHECKPOINT_DIR"
ENV_RESUME = "CLUSTERSDK_RESUME"  # the newest checkpoint a script saved, when it comes back
ENV_WARM_CUDA = "CLUSTERSDK_WARM_CUDA"  # "1": a rank process forked ahead makes its CUDA context


def torchrun_environ(
    rank: int,
    hosts: Sequence[str],
    master_addr: str,
    master_port: int,
    spec: WireSpec,
    cuda: bool,
    error_file: str,
    inherited: Mapping[str, str],
) -> dict[str, str]:
    """The variables torchrun (``torch.distributed.run``, its ``LocalElasticAgent``) gives
    a worker process, for rank ``rank`` of a gang whose ranks run on ``hosts`` (rank
    order: sorted by host, so each host's ranks are contiguous, as torchrun's are).

    A host is torchrun's node (its agent's group): ``GROUP_RANK`` its index,
    ``LOCAL_RANK`` the rank's index on it. A GPU slot's worker pins its GPU
    (``CUDA_VISIBLE_DEVICES``): there ``LOCAL_RANK`` is 0, as under
    ``torchrun --virtual-local-rank``, so that ``cuda:LOCAL_RANK`` is that GPU.
    ``OMP_NUM_THREADS`` is torchrun's: the job's ``env`` value, else 1 when more than one
    rank shares the host. The restart count is the gang start (a restart, a resume).

    >>> spec = WireSpec(id="j1", name="j", world_size=3, max_restarts=1, attempt=2)
    >>> env = torchrun_environ(2, ["a", "a", "b"], "a", 29500, spec, False, "/e", {})
    >>> [env[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE",
    ...                   "TORCHELASTIC_RESTART_COUNT")]
    ['2', '0', '1', '1', '2']
    """
    host = hosts[rank]
    order = list(dict.fromkeys(hosts))  # hosts in rank order
    local = [r for r, h in enumerate(hosts) if h == host]
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": "0" if cuda else str(local.index(rank)),
        "WORLD_SIZE": str(len(hosts)),
        "LOCAL_WORLD_SIZE": str(len(local)),
        "GROUP_RANK": str(order.index(host)),
        "GROUP_WORLD_SIZE": str(len(order)),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": str(len(hosts)),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(spec.attempt),
        "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
        "TORCHELASTIC_RUN_ID": spec.id,
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_ERROR_FILE": error_file,
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": inherited.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }
    threads = (spec.env or {}).get("OMP_NUM_THREADS")
    if threads is None and len(local) > 1:
        threads = "1"
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    return env


def rank_environ(
    rank: int,
    hosts: Sequence[str],
    master_addr: str,
    master_port: int,
    spec: WireSpec,
    gpu: int | None,
    error_file: str,
    worker: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The whole environment of rank ``rank``'s process: the worker's (``worker``, by
    default ``os.environ``), the job's ``env``, the interface towards rank 0 unless set,
    torchrun's variables, and clustersdk's own (the job's name, its checkpoint directory
    and the checkpoint a script resumes from). ``gpu``: the slot's GPU (None: a CPU slot).

    >>> spec = WireSpec(id="j1", name="j", world_size=2, env={"NCCL_DEBUG": "INFO"})
    >>> env = rank_environ(1, ["h", "h"], "127.0.0.1", 29500, spec, None, "/e", {"A": "1"})
    >>> env["A"], env["NCCL_DEBUG"], env["RANK"], env["LOCAL_RANK"], env["OMP_NUM_THREADS"]
    ('1', 'INFO', '1', '1', '1')
    """
    out = dict(os.environ if worker is None else worker)
    wanted = dict(spec.env or {})
    # gloo and NCCL authenticate no peer: they listen only on the interface towards rank 0
    missing = [v for v in network.IFNAME_VARIABLES if v not in wanted and v not in out]
    interface = network.interface_towards(master_addr) if missing else None
    if interface is not None:
        wanted.update(dict.fromkeys(missing, interface))
    out.update(wanted)
    cuda = gpu is not None
    out.update(torchrun_environ(rank, hosts, master_addr, master_port, spec, cuda, error_file, out))
    if cuda:  # one GPU per rank: the worker's own
        visible = out.get("CUDA_VISIBLE_DEVICES") or str(max(gpu or 0, 0))
        out["CUDA_VISIBLE_DEVICES"] = visible.split(",")[0]
    out[ENV_JOB] = spec.name
    if spec.checkpoint_dir:
        out[ENV_CHECKPOINT_DIR] = spec.checkpoint_dir
    if spec.resume:
        out[ENV_RESUME] = spec.resume
    return out
