"""Where each rank sits in a job's device mesh, and which ranks share a batch.

Pure logic (no torch): the spec checks a mesh at launch with it, and every
rank computes its coordinates from it without a collective.

A mesh is a dict of named dimensions, e.g. ``{"dp": 2, "tp": 2}``; one size
may be ``-1`` ("the rest of the ranks"), so that a job can resume at another
world size. Ranks are laid out row-major in the canonical order
``pp, dp, ep, tp``: tensor-parallel peers are adjacent ranks (on GPUs, the
same host's fast links), and pipeline stages are the outermost blocks of
ranks (a stage sends only activations to the next, the lightest traffic, so
it may cross hosts), as Megatron-LM and torchtitan lay them out.

3-D: ``strategy="fsdp"`` with ``mesh={"dp": D, "tp": T, "pp": P}`` (or
``{"dp", "pp"}``) pipelines the model over ``pp`` stages, each stage tensor
parallel within its ``tp`` group and FSDP-sharded across ``dp``.

What "global batch" means per layout: ``ctx.shard(dataset, batch_size)``
gives each *data-parallel* rank ``batch_size`` samples, so one optimizer step
sees ``batch_size * dp_size`` samples. The data-parallel dimension is ``dp``
(``ddp``, ``fsdp``) or ``ep`` (expert parallel: dense layers are data
parallel). Ranks with the same data-parallel coordinate - tensor-parallel
peers, pipeline stages - get the same samples; with ``tp`` or ``pp`` alone,
``dp_size`` is 1 and every rank sees the whole global batch.

>>> Layout.resolve("fsdp", {"dp": -1, "tp": 2}, 4).dims
(('dp', 2), ('tp', 2))
>>> Layout.resolve("fsdp", {"dp": -1, "tp": 2}, 4).coords(3)
{'dp': 1, 'tp': 1}
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any

from .errors import SpecError

ORDER = ("pp", "dp", "ep", "tp")  # outermost first
DATA_DIMS = ("dp", "ep")  # dims whose ranks read different samples

# strategy -> the mesh layouts it accepts (sets of dim names); the first is its default
LAYOUTS: dict[str, tuple[frozenset[str], ...]] = {
    "ddp": (frozenset({"dp"}),),
    "fsdp": (
        frozenset({"dp"}),
        frozenset({"dp", "tp"}),
        frozenset({"dp", "pp"}),
        frozenset({"dp", "tp", "pp"}),
    ),
    "tp": (frozenset({"tp"}),),
    "pp": (frozenset({"pp"}),),
    "ep": (frozenset({"ep"}),),
    "none": (frozenset({"dp"}),),
}
_DEFAULT_DIM = {"ddp": "dp", "fsdp": "dp", "tp": "tp", "pp": "pp", "ep": "ep", "none": "dp"}


@dataclasses.dataclass(frozen=True)
class Layout:
    """A resolved mesh: ``dims`` in canonical order, sizes multiplying to ``world_size``."""

    strategy: str
    dims: tuple[tuple[str, int], ...]

    @classmethod
    def resolve(cls, strategy: str, mesh: Mapping[str, Any] | None, world_size: int) -> Layout:
        """Check ``mesh`` against the strategy and world size; fill in a ``-1``.

        Raises :class:`SpecError` naming the mesh and the world size when they
        do not fit.
        """
        if mesh is None:
            return cls(strategy, ((_DEFAULT_DIM.get(strategy, "dp"), world_size),))
        if not isinstance(mesh, Mapping) or not mesh:
            raise SpecError(
                f"mesh must be a dict of dimension sizes like {{'dp': 2, 'tp': 2}}, got {mesh!r}"
            )
        allowed = LAYOUTS.get(strategy, ())
        names = frozenset(mesh)
        if strategy != "none" and names not in allowed:
            options = " or ".join(repr({n: "…" for n in _ordered(a)}) for a in allowed)
            hint = ""
            if "pp" in names and "dp" in names:
                hint = (
                    "; for pipeline stages over FSDP (3-D) use strategy='fsdp' with "
                    "mesh={'dp': ..., 'tp': ..., 'pp': ...}"
                )
            elif "tp" in names and "dp" in names:
                hint = "; for FSDP over TP use strategy='fsdp' with mesh={'dp': ..., 'tp': ...}"
            raise SpecError(
                f"strategy={strategy!r} takes a mesh of {options}, got {dict(mesh)!r}{hint}"
            )
        unknown = sorted(names - set(ORDER))
        if unknown:
            raise SpecError(f"mesh dimension(s) {unknown} unknown; use names from {list(ORDER)}")
        sizes: dict[str, int] = {}
        for name, size in mesh.items():
            if (
                isinstance(size, bool)
                or not isinstance(size, numbers.Integral)
                or (size < 1 and size != -1)
            ):
                raise SpecError(
                    f"mesh[{name!r}] must be a positive int or -1 (the rest), got {size!r}"
                )
            sizes[name] = int(size)
        free = [n for n, s in sizes.items() if s == -1]
        if len(free) > 1:
            raise SpecError(f"mesh {dict(mesh)!r}: at most one dimension may be -1")
        fixed = math.prod(s for s in sizes.values() if s != -1)
        if free:
            if world_size % fixed:
                raise SpecError(
                    f"mesh {dict(mesh)!r} can't fill world_size={world_size}: "
                    f"{world_size} is not a multiple of {fixed}"
                )
            sizes[free[0]] = world_size // fixed
        elif fixed != world_size:
            product = " x ".join(str(sizes[n]) for n in _ordered(sizes))
            raise SpecError(
                f"mesh {dict(mesh)!r} has {fixed} ranks ({product}) but "
                f"world_size={world_size}; make the product equal the world size"
            )
        return cls(strategy, tuple((n, sizes[n]) for n in _ordered(sizes)))

    # --- shape ----------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.dims)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s for _, s in self.dims)

    @property
    def world_size(self) -> int:
        return math.prod(self.shape)

    def size(self, name: str) -> int:
        """The size of dimension ``name`` (1 when the mesh has no such dimension)."""
        return dict(self.dims).get(name, 1)

    @property
    def pipelined(self) -> bool:
        """Whether the model runs as pipeline stages (``pp``, or a mesh with a ``pp`` dim)."""
        return "pp" in self.names

    def coords(self, rank: int) -> dict[str, int]:
        """``rank``'s coordinate along each dimension (row-major, last dim fastest)."""
        out: dict[str, int] = {}
        for name, size in reversed(self.dims):
            rank, out[name] = divmod(rank, size)
        return {n: out[n] for n in self.names}

    # --- data ---------------------------------------------------------------------
    @property
    def dp_size(self) -> int:
        """How many ranks read different samples (1 under pure ``tp`` or ``pp``)."""
        return math.prod(self.size(n) for n in DATA_DIMS)

    def dp_rank(self, rank: int) -> int:
        coords = self.coords(rank)
        index = 0
        for name in DATA_DIMS:
            index = index * self.size(name) + coords.get(name, 0)
        return index

    def __str__(self) -> str:
        return " x ".join(f"{n}={s}" for n, s in self.dims)


def _ordered(names: Any) -> list[str]:
    return sorted(names, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))
