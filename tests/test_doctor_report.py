"""The doctor's pure logic: from facts to one-line problems (no cluster needed)."""

from __future__ import annotations

import pytest

from clustersdk.doctor.report import (
    Report,
    Sweep,
    analyse,
    bandwidth_problems,
    bus_bandwidth,
    clock_problems,
    disk_problems,
    format_report,
    gpu_problems,
    port_problems,
    version_problems,
)

BASE = {"python": "3.11.7", "torch": "2.13.0", "clustersdk": "0.1.0", "cloudpickle": "3.1.3"}


def worker(host: str, **versions) -> dict:
    return {
        "worker": f"tcp://{host}:1",
        "host": host,
        "versions": {**BASE, **versions},
        "gpus": None,
        "clock_offset": 0.0,
        "clock_error": 0.001,
    }


def test_bus_bandwidth_follows_nccl_tests():
    # all-reduce: busbw = algbw * 2 (n - 1) / n
    assert bus_bandwidth(1000, 1.0, 2) == (1000.0, 1000.0)
    assert bus_bandwidth(1000, 1.0, 4) == (1000.0, 1500.0)
    assert bus_bandwidth(1 << 20, 0.5, 8)[1] == pytest.approx((1 << 21) * 2 * 7 / 8)


def test_the_odd_version_out_is_named_with_what_to_install():
    workers = [worker("a"), worker("b"), worker("c", torch="2.12.1")]
    [problem] = version_problems(workers, BASE)
    assert (problem.host, problem.check) == ("c", "versions")
    assert problem.message.startswith(
        "host c: torch 2.12.1, but 2.13.0 on the other hosts: install torch==2.13.0 there"
    )


def test_a_notebook_that_differs_from_every_worker_is_named():
    [problem] = version_problems([worker("a"), worker("b")], {**BASE, "cloudpickle": "2.2.1"})
    assert problem.host is None
    assert problem.message.startswith(
        "this notebook: cloudpickle 2.2.1, but the workers have 3.1.3"
    )


def test_a_tie_between_two_hosts_sides_with_the_notebook():
    [problem] = version_problems([worker("a", clustersdk="0.0.9"), worker("b")], BASE)
    assert problem.host == "a"


def test_unreachable_ports_are_grouped_by_who_could_not_reach_them():
    ports = {
        "b": {
            "range": "29500-29509",
            "listening": list(range(29500, 29510)),
            "busy": [],
            "size": 10,
            "unreachable": {
                29501: {"a": "timed out", "c": "timed out"},
                29502: {"a": "timed out", "c": "timed out"},
                29507: {"c": "Connection refused"},
            },
        },
        "a": {
            "range": "29500-29509",
            "listening": [],
            "busy": list(range(29500, 29510)),
            "size": 10,
            "unreachable": {},
        },
    }
    problems = [p.message for p in port_problems(ports)]
    assert problems[0].startswith(
        "host a: every port of the rendezvous range (29500-29509) is in use there"
    )
    assert problems[1].startswith(
        "host b: ports 29501-29502 of the rendezvous range "
        "(29500-29509) unreachable from a, c (timed out)"
    )
    assert problems[2].startswith(
        "host b: port 29507 of the rendezvous range (29500-29509) "
        "unreachable from c (Connection refused)"
    )


def test_disk_problems_say_what_is_wrong_at_the_checkpoint_directory():
    disks = {
        "a": {"path": "/ckpt", "free": 10 << 30, "unseen": []},
        "b": {"path": "/ckpt", "error": "PermissionError: Permission denied"},
        "c": {"path": "/ckpt", "free": 100 << 20, "unseen": ["a"]},
    }
    messages = [p.message for p in disk_problems(disks, min_free=1 << 30)]
    assert messages[0].startswith("host b: cannot write to /ckpt (PermissionError")
    assert messages[1].startswith("host c: only 100 MiB free at /ckpt")
    assert messages[2].startswith(
        "host c: does not see the files a wrote in /ckpt: "
        "checkpoint_dir must be one shared filesystem"
    )


def test_clock_skew_beyond_the_limit_and_its_uncertainty():
    workers = [
        worker("a"),
        {**worker("b"), "clock_offset": 3.2},
        {**worker("c"), "clock_offset": -1.05, "clock_error": 0.1},
    ]
    [problem] = clock_problems(workers, limit=1.0)
    assert problem.message.startswith("host b: its clock is 3.2 s ahead of this machine's")


def test_gpu_health():
    sick = {
        **worker("a"),
        "gpus": [
            {"index": 0, "name": "H100", "temperature": 40, "ecc_uncorrected": 3},
            {"index": 1, "name": "H100", "temperature": 91, "ecc_uncorrected": 0},
        ],
    }
    lost = {**worker("b"), "slot_kind": "cuda", "gpus": []}
    messages = [p.message for p in gpu_problems([sick, lost])]
    assert messages[0].startswith("host a: GPU 0 (H100) has 3 uncorrected ECC errors")
    assert messages[1].startswith("host a: GPU 1 (H100) is at 91 C")
    assert messages[2].startswith("host b: worker tcp://b:1 has a CUDA slot but NVML sees no GPU")


def sweep(a: str, b: str, peak_s: float) -> Sweep:
    return Sweep((a, b), "gloo", rows=[(1 << 20, peak_s * 10), (4 << 20, peak_s)])


def test_a_host_whose_every_link_is_slow_is_named():
    sweeps = [sweep("a", "b", 0.004), sweep("a", "c", 0.05), sweep("b", "c", 0.04)]
    [problem] = bandwidth_problems(sweeps)
    assert problem.host == "c" and problem.message.startswith("host c: its links reach 0.10x")


def test_a_single_slow_link_is_named_as_the_pair():
    sweeps = [
        sweep("a", "b", 0.004),
        sweep("a", "c", 0.004),
        sweep("b", "c", 0.04),
        sweep("a", "d", 0.004),
        sweep("b", "d", 0.004),
        sweep("c", "d", 0.004),
    ]
    [problem] = bandwidth_problems(sweeps)
    assert problem.host == "b-c" and problem.message.startswith("hosts b and c: their link")


def test_equal_links_and_a_failed_pair():
    sweeps = [
        sweep("a", "b", 0.004),
        sweep("a", "c", 0.0041),
        Sweep(("b", "c"), "gloo", error="RuntimeError: boom"),
    ]
    [problem] = bandwidth_problems(sweeps)
    assert problem.message.startswith(
        "hosts b and c: an all-reduce between them failed (RuntimeError: boom)"
    )


def test_a_report_formats_its_table_and_problems():
    report = Report(
        [worker("a"), worker("b", torch="2.12.1")], BASE, {}, {}, [sweep("a", "b", 0.004)]
    )
    report.problems = analyse(report)
    text = format_report(report)
    assert "all-reduce bus bandwidth (gloo, 2 ranks per pair, GB/s)" in text
    assert "4 MiB" in text and f"{(4 << 20) / 0.004 / 1e9:.3f}" in text
    assert text.splitlines()[-2] == "problems (1):" and not report.ok
    assert report.to_dict()["sweeps"][0]["busbw"][1]["busbw"] == pytest.approx((4 << 20) / 0.004)
