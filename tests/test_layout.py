"""Mesh layouts: resolution, coordinates, which ranks share a batch (pure, no torch)."""

from __future__ import annotations

import re

import pytest

from clustersdk.errors import SpecError
from clustersdk.layout import Layout


def test_default_mesh_puts_every_rank_on_the_strategy_dimension():
    assert Layout.resolve("fsdp", None, 4).dims == (("dp", 4),)
    assert Layout.resolve("tp", None, 2).dims == (("tp", 2),)
    assert Layout.resolve("pp", None, 2).dims == (("pp", 2),)
    assert Layout.resolve("ep", None, 2).dims == (("ep", 2),)


def test_two_d_mesh_is_ordered_dp_outer_tp_inner_whatever_the_dict_order():
    layout = Layout.resolve("fsdp", {"tp": 2, "dp": 2}, 4)
    assert layout.dims == (("dp", 2), ("tp", 2))
    assert [layout.coords(r) for r in range(4)] == [
        {"dp": 0, "tp": 0},
        {"dp": 0, "tp": 1},
        {"dp": 1, "tp": 0},
        {"dp": 1, "tp": 1},
    ]
    assert str(layout) == "dp=2 x tp=2"


@pytest.mark.parametrize(
    "strategy, mesh, ws, dp_size, dp_ranks",
    [
        ("ddp", None, 4, 4, [0, 1, 2, 3]),
        ("tp", None, 2, 1, [0, 0]),
        ("pp", None, 2, 1, [0, 0]),
        ("ep", None, 2, 2, [0, 1]),
        ("fsdp", {"dp": 2, "tp": 2}, 4, 2, [0, 0, 1, 1]),
    ],
)
def test_ranks_that_share_a_data_coordinate_share_batches(strategy, mesh, ws, dp_size, dp_ranks):
    layout = Layout.resolve(strategy, mesh, ws)
    assert layout.dp_size == dp_size
    assert [layout.dp_rank(r) for r in range(ws)] == dp_ranks


def test_three_d_mesh_puts_stages_outermost_and_tp_peers_adjacent():
    layout = Layout.resolve("fsdp", {"dp": 2, "tp": 2, "pp": 2}, 8)
    assert layout.dims == (("pp", 2), ("dp", 2), ("tp", 2)) and layout.pipelined
    assert [layout.coords(r)["pp"] for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [layout.coords(r)["tp"] for r in range(8)] == [0, 1] * 4
    # every stage reads the same two data-parallel shards; TP peers and stages share them
    assert layout.dp_size == 2
    assert [layout.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert Layout.resolve("fsdp", {"dp": -1, "pp": 2}, 6).dims == (("pp", 2), ("dp", 3))
    assert not Layout.resolve("fsdp", {"dp": 2, "tp": 2}, 4).pipelined


def test_minus_one_takes_the_rest_so_a_job_can_resume_at_another_size():
    assert Layout.resolve("fsdp", {"dp": -1, "tp": 2}, 8).dims == (("dp", 4), ("tp", 2))
    assert Layout.resolve("fsdp", {"dp": -1, "tp": 2}, 2).dims == (("dp", 1), ("tp", 2))


@pytest.mark.parametrize(
    "strategy, mesh, ws, message",
    [
        (
            "fsdp",
            {"dp": 2, "tp": 2},
            2,
            "mesh {'dp': 2, 'tp': 2} has 4 ranks (2 x 2) but world_size=2",
        ),
        ("fsdp", {"dp": -1, "tp": 3}, 4, "can't fill world_size=4: 4 is not a multiple of 3"),
        ("fsdp", {"dp": -1, "tp": -1}, 4, "at most one dimension may be -1"),
        ("fsdp", {"dp": 0}, 4, "mesh['dp'] must be a positive int or -1 (the rest), got 0"),
        ("fsdp", {"dp": 2.0}, 2, "mesh['dp'] must be a positive int or -1 (the rest), got 2.0"),
        ("tp", {"dp": 2, "tp": 2}, 4, "for FSDP over TP use strategy='fsdp'"),
        ("ddp", {"pp": 2}, 2, "strategy='ddp' takes a mesh of {'dp': '…'}, got {'pp': 2}"),
        ("pp", {"dp": 2, "pp": 2}, 4, "for pipeline stages over FSDP (3-D) use strategy='fsdp'"),
        (
            "fsdp",
            {"dp": 2, "tp": 2, "pp": 2},
            4,
            "mesh {'dp': 2, 'tp': 2, 'pp': 2} has 8 ranks (2 x 2 x 2) but world_size=4",
        ),
        ("none", {"xx": 2}, 2, "mesh dimension(s) ['xx'] unknown"),
        ("fsdp", [2], 2, "mesh must be a dict of dimension sizes"),
    ],
)
def test_bad_meshes_name_the_values(strategy, mesh, ws, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        Layout.resolve(strategy, mesh, ws)
