"""clustersdk.registry: the small on-disk list of clusters the server extension reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import clustersdk as cs
from clustersdk import registry


def test_register_list_unregister(tmp_path):
    path = registry.register("tcp://10.0.0.5:8786", kind="connect", local=False, state_dir=tmp_path)
    assert path == str(tmp_path / "clusters" / f"tcp-10.0.0.5-8786-{os.getpid()}.json")
    (entry,) = registry.entries(tmp_path)
    assert (entry["address"], entry["kind"], entry["local"], entry["pid"]) == (
        "tcp://10.0.0.5:8786",
        "connect",
        False,
        os.getpid(),
    )
    assert entry["created"] > 0 and entry["path"] == path
    registry.unregister(path)
    registry.unregister(path)  # twice is fine
    registry.unregister(None)
    assert registry.entries(tmp_path) == []
    assert registry.entries(tmp_path / "never-made") == []


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_local_cluster_whose_process_died_is_dropped_and_its_file_removed(tmp_path):
    dead = _dead_pid()
    gone = registry.register(
        "tcp://127.0.0.1:1111", kind="local", local=True, state_dir=tmp_path, pid=dead
    )
    kept = registry.register(
        "tcp://10.0.0.5:8786", kind="connect", local=False, state_dir=tmp_path, pid=dead
    )
    assert [e["address"] for e in registry.entries(tmp_path)] == ["tcp://10.0.0.5:8786"]
    assert not os.path.exists(gone) and os.path.exists(kept)


def test_one_entry_per_address_and_unreadable_files_are_skipped(tmp_path):
    first = registry.register("tcp://a:1", kind="connect", local=False, state_dir=tmp_path, pid=1)
    registry.register("tcp://a:1", kind="connect", local=False, state_dir=tmp_path)
    (tmp_path / "clusters" / "junk.json").write_text("{not json")
    (tmp_path / "clusters" / "list.json").write_text(json.dumps([1, 2]))
    (entry,) = registry.entries(tmp_path)
    assert entry["path"] == first  # the oldest registration of that address


def test_an_unwritable_registry_does_not_stop_the_cluster(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert registry.register("tcp://a:1", kind="local", local=True, state_dir=blocker) is None
    assert "could not register cluster tcp://a:1" in caplog.text


def test_clusters_register_themselves_and_unregister_on_close(sdk_cluster, sdk_state, tmp_path):
    assert sdk_cluster.scheduler_address in [e["address"] for e in registry.entries(sdk_state)]
    (local,) = [
        e for e in registry.entries(sdk_state) if e["address"] == sdk_cluster.scheduler_address
    ]
    assert (local["kind"], local["local"]) == ("local", True)
    # a TLS cluster's entry says where its creator's credentials and authority are
    assert local["credentials"] == sdk_cluster.credentials
    assert registry.credentials(sdk_cluster.scheduler_address, sdk_state) == local["credentials"]
    assert os.path.exists(os.path.join(local["authority"], "ca.pem"))

    # another state directory knows nothing of it: its credentials are given
    attached = cs.Cluster.connect(
        sdk_cluster.scheduler_address, state_dir=str(tmp_path), credentials=sdk_cluster.credentials
    )
    try:
        (entry,) = registry.entries(tmp_path)
        assert (entry["address"], entry["kind"], entry["local"]) == (
            sdk_cluster.scheduler_address,
            "connect",
            False,
        )
        assert entry["credentials"] == sdk_cluster.credentials and "authority" not in entry
    finally:
        attached.close()
    assert registry.entries(tmp_path) == []
