"""Safe by default, on a real local cluster with real TLS: strangers get nothing, each
request's identity is its certificate, and a job's owner (or an admin) alone changes it.

alice creates the cluster (its admin); bob and carol get credentials from her.
Multi-host (the namespace bed, a real sshd) and Slurm: tests/multihost/test_security.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import dask.config
import pytest

import clustersdk as cs
from clustersdk.cluster import shipping
from clustersdk.control.access import KINDS, Access, Job
from clustersdk.protocol import Op, WorkerOp, op, topic
from clustersdk.security import tls
from clustersdk.security.identity import Identity
from clustersdk.security.pki import Authority, read_credentials, revoked_serials
from clustersdk.spec import JobSpec

from . import security_probe, workloads
from .helpers import wait_for

ROOT = Path(__file__).resolve().parents[1]
ALICE, BOB = Identity("alice", "admin", 1), Identity("bob", "user", 2)


# --- the rules, pure -----------------------------------------------------------------------------
def test_every_operation_of_the_control_plane_has_a_rule():
    assert set(KINDS) == set(Op)


@pytest.mark.parametrize(
    "operation",
    [
        Op.STOP,
        Op.PAUSE,
        Op.RESUME,
        Op.CHECKPOINT,
        Op.SUSPEND,
        Op.UPDATE,
        Op.RUN,
        Op.RESTART,
        Op.DEBUG,
        Op.CONSOLE,
        Op.PROFILE,
    ],
)
def test_only_the_owner_or_an_admin_changes_a_job(operation):
    rules, job = Access(enforced=True), Job("j1", "train", "alice")
    with pytest.raises(
        cs.AccessDeniedError,
        match=r"'bob' may not .* job 'train' \(id j1\): "
        r"it belongs to 'alice'",
    ) as refused:
        rules.check(operation, BOB, job)
    assert (refused.value.owner, refused.value.identity) == ("alice", "bob")
    rules.check(operation, Identity("alice", "user", 3), job)  # its owner
    rules.check(operation, Identity("root", "admin", 4), job)  # an admin
    rules.check(operation, Identity("worker", "worker", 5), job)  # the cluster itself
    Access(enforced=False).check(operation, BOB, job)  # no TLS: no identities to check


def test_everyone_sees_and_launches_only_admins_configure_only_the_cluster_reports():
    rules, job = Access(enforced=True), Job("j1", "train", "alice")
    for operation in (Op.JOBS, Op.JOB, Op.QUEUE, Op.INVENTORY, Op.HISTORY, Op.LOGS, Op.SUBMIT):
        rules.check(operation, BOB, job)
    with pytest.raises(cs.AccessDeniedError, match="only an admin may"):
        rules.check(Op.CONFIGURE, BOB)
    rules.check(Op.CONFIGURE, ALICE)
    with pytest.raises(cs.AccessDeniedError, match="only the cluster's own workers"):
        rules.check(Op.RANK_EVENT, ALICE)  # not even an admin forges rank reports
    with pytest.raises(cs.AccessDeniedError, match="only the cluster's own workers"):
        rules.check(Op.LIVE_PENDING, BOB)  # (it hands out job.run functions)
    rules.check(Op.RANK_EVENT, Identity("worker", "worker", 9))


def test_hidden_metrics_are_their_owners_and_a_revoked_certificate_gets_nothing():
    rules, job = Access(enforced=True, hide_metrics=True), Job("j1", "train", "alice")
    with pytest.raises(cs.AccessDeniedError, match="may not see the metrics of job 'train'"):
        rules.check(Op.HISTORY, BOB, job)
    rules.check(Op.JOBS, BOB)  # the queue and the records stay visible
    rules.check(Op.HISTORY, Identity("alice", "user", 3), job)
    rules.revoke({2})
    with pytest.raises(
        cs.AccessDeniedError,
        match=r"certificate of 'bob' \(serial 2\) was "
        "revoked",
    ):
        rules.check(Op.JOBS, BOB)
    assert not rules.may_change(Identity("bob", "admin", 2), "bob")


def test_identities_come_from_the_certificate_subject():
    cert = {
        "subject": ((("commonName", "bob"),), (("organizationalUnitName", "user"),)),
        "serialNumber": "0A",
    }
    assert Identity.from_peercert(cert) == Identity("bob", "user", 10)
    # another PKI's certificate without a role: a user, unless it is the scheduler's own
    other = {"subject": ((("commonName", "dask-internal"),),), "serialNumber": "01"}
    assert Identity.from_peercert(other).role == "user"
    assert Identity.from_peercert(other, ("dask-internal", "")).cluster
    assert Identity.from_peercert(None).anonymous


# --- the authority, on disk ---------------------------------------------------------------------------
def test_an_authority_keeps_its_keys_private_and_revokes(tmp_path):
    ca = Authority.create(str(tmp_path / "tls"), admin="alice", days=30)
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
    assert mode(ca.directory) == 0o700
    assert mode(tmp_path / "tls" / "ca-key.pem") == mode(ca.worker_file) == 0o600
    path = ca.add_user("bob")
    assert mode(path) == 0o600 and ca.active_users() == ["alice", "bob"]
    bob = read_credentials(path)
    assert (bob.name, bob.role, bob.admin) == ("bob", "user", False)
    with pytest.raises(cs.SpecError, match="'bob' already has credentials"):
        ca.add_user("bob")  # one certificate per person
    with pytest.raises(cs.SpecError, match="a user name must be"):
        ca.add_user("../etc")
    serial, crl = ca.remove_user("bob")
    assert serial == bob.serial and revoked_serials(crl) == {bob.serial}
    assert not os.path.exists(path) and ca.users()["bob"]["revoked"]
    assert ca.add_user("bob") != ""  # new credentials for bob, after the old ones' revocation
    assert revoked_serials(ca.crl_pem()) == {bob.serial}


# --- a real local cluster ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def alice(tmp_path_factory):
    """Two CPU slots, created by alice (its admin)."""
    with dask.config.set({"clustersdk.security.user": "alice"}):
        cluster = cs.Cluster.local(workers=2, state_dir=str(tmp_path_factory.mktemp("alice")))
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def bob(alice, tmp_path_factory):
    """bob's own connection to alice's cluster, with the credentials she gave him."""
    path = alice.add_user("bob", path=str(tmp_path_factory.mktemp("bob") / "bob.pem"))
    cluster = cs.Cluster.connect(
        alice.scheduler_address,
        credentials=path,
        state_dir=str(tmp_path_factory.mktemp("bob-state")),
    )
    try:
        yield cluster
    finally:
        cluster.close()


def targets(cluster: cs.Cluster) -> list[str]:
    info = cluster.client.scheduler_info(n_workers=-1)["workers"]
    return (
        [f"scheduler={cluster.scheduler_address}"]
        + [f"worker={w}" for w in info]
        + [f"nanny={w['nanny']}" for w in info.values()]
    )


def probe(cluster: cs.Cluster, marker: Path, other: str) -> dict[str, str]:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "security_probe.py"),
            "--marker",
            str(marker),
            "--other-credentials",
            other,
            *targets(cluster),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout)


def test_strangers_on_loopback_get_nothing_from_a_local_cluster(alice, tmp_path):
    assert alice.scheduler_address.startswith("tls://")
    other = Authority.create(str(tmp_path / "other-ca"), admin="mallory")
    marker = tmp_path / "stranger-was-here"
    answers = probe(alice, marker, other.credentials_file("mallory"))
    assert len(answers) == 3 * 5  # a scheduler, two workers, two nannies; three ways each
    assert all(a.startswith("refused") for a in answers.values()), answers
    assert not marker.exists()  # no code of theirs ran anywhere


def test_bob_sees_alices_job_and_may_not_change_it(alice, bob, tmp_path):
    job = alice.launch(workloads.spin, world_size=1, name="alice-train")
    try:
        wait_for(lambda: len(job.history()) >= 3, timeout=60)
        his = cs.Job.attach(bob, "alice-train")
        assert his.owner == "alice" and his.status is cs.JobStatus.RUNNING
        assert "alice-train" in [j.name for j in bob.jobs()] and his.history()
        marker = tmp_path / "bob-ran-this"
        attempts = {
            "pause": lambda: his.pause(timeout=10),
            "stop": his.stop,
            "update": lambda: his.update(lr=0.5),
            "run code in (job.run)": lambda: his.run(lambda ctx: marker.touch()),
            "checkpoint": his.checkpoint,
            "resume": his.resume,
        }
        for verb, attempt in attempts.items():
            with pytest.raises(cs.AccessDeniedError) as refused:
                attempt()
            assert str(refused.value) == (
                f"'bob' may not {verb} job 'alice-train' (id {job.id}): it belongs to 'alice'; "
                "only its owner or an admin may change it"
            )
        step = max(r["step"] for r in job.history())
        wait_for(lambda: max(r["step"] for r in job.history()) > step, timeout=30)
        assert job.status is cs.JobStatus.RUNNING and not marker.exists()
        assert not [e for e in job.events() if e.get("by") == "bob"]  # nothing changed
    finally:
        job.stop()


def test_bobs_job_is_his_whatever_his_client_claims_and_alice_may_stop_it(alice, bob):
    mine = bob.launch(workloads.spin, world_size=1, name="bob-train")
    assert mine.owner == "bob" and bob.whoami()["name"] == "bob"
    wait_for(lambda: mine.status is cs.JobStatus.RUNNING, timeout=60)
    mine.pause(timeout=30)
    assert mine.resume() is cs.JobStatus.RUNNING  # his own job: his to change
    # a client that says it is alice: the owner is still the certificate's name
    spec = JobSpec(fn=workloads.count_to, kwargs={"steps": 2}, world_size=1, name="claims-alice")
    wire = spec.to_wire().replace(owner="alice")
    record = bob.sync(bob.control.submit, wire, shipping.payload(spec, bob.client))
    assert record["spec"]["owner"] == "bob"
    assert alice.job_record(record["id"])["spec"]["owner"] == "bob"
    # the admin may stop anyone's job; who asked is journaled
    assert cs.Job.attach(alice, "bob-train").stop() is cs.JobStatus.STOPPED
    asked = [(e["op"], e["by"]) for e in mine.events() if e["kind"] == "request"]
    assert asked == [("pause", "bob"), ("resume", "bob"), ("stop", "alice")]
    bob.job("claims-alice").wait(timeout=60)


TICKER = (
    "import time\nfor i in range(3000):\n    print('tick', i, flush=True)\n    time.sleep(0.1)\n"
)


def test_a_script_job_is_its_launchers_and_bob_may_not_change_alices(alice, bob, tmp_path):
    script = tmp_path / "ticker.py"
    script.write_text(TICKER)
    job = alice.launch_script(str(script), world_size=1, name="alice-script")
    try:
        wait_for(lambda: "tick 3" in job.logs(), timeout=90)
        his = cs.Job.attach(bob, "alice-script")
        assert his.owner == "alice" and his.status is cs.JobStatus.RUNNING
        for verb, attempt in {
            "stop": his.stop,
            "suspend": his.suspend,
            "pause": lambda: his.pause(timeout=10),
            "checkpoint": his.checkpoint,
        }.items():
            with pytest.raises(cs.AccessDeniedError) as refused:
                attempt()
            assert str(refused.value) == (
                f"'bob' may not {verb} job 'alice-script' (id {job.id}): it belongs to "
                "'alice'; only its owner or an admin may change it"
            )
        printed = job.logs().count("tick")
        wait_for(lambda: job.logs().count("tick") > printed, timeout=30)  # still running
        assert job.status is cs.JobStatus.RUNNING
        assert not [e for e in job.events() if e.get("by") == "bob"]

        # bob's script job is his, even when his client says it is alice's
        spec = JobSpec(fn=None, script=str(script), world_size=1, name="bob-script")
        wire = spec.to_wire().replace(owner="alice")
        record = bob.sync(bob.control.submit, wire, shipping.script_payload(spec, bob.client))
        assert record["spec"]["owner"] == "bob"
        mine = bob.job("bob-script")
        assert mine.owner == "bob"
        wait_for(lambda: "tick 1" in mine.logs(), timeout=90)
        assert mine.stop(timeout=60) is cs.JobStatus.STOPPED  # his own: his to stop
        asked = [(e["op"], e["by"]) for e in mine.events() if e["kind"] == "request"]
        assert asked == [("stop", "bob")]
    finally:
        job.stop(timeout=60)
    assert job.status is cs.JobStatus.STOPPED  # alice's own stop works


def test_what_runs_code_in_the_scheduler_is_an_admins(alice, bob, tmp_path):
    marker = tmp_path / "in-the-scheduler"
    with pytest.raises(
        cs.AccessDeniedError, match="'bob' may not call the scheduler's 'run_function'"
    ):
        bob.client.run_on_scheduler(security_probe.make_marker, str(marker))
    future = bob.client.submit(security_probe.make_marker, str(marker))  # unpickled there
    with pytest.raises(cs.AccessDeniedError, match="'update-graph'"):
        future.result(timeout=30)
    with pytest.raises(cs.AccessDeniedError, match="'register_worker_plugin'"):
        bob.client.register_plugin(cs_agent())
    assert not marker.exists()
    # nor may bob pose as the ranks or the control plane
    job = alice.launch(workloads.spin, world_size=1, name="guarded")
    try:
        wait_for(lambda: job.status is cs.JobStatus.RUNNING, timeout=60)
        worker = job.info()["ranks"][0]["worker"]
        stop = [0] * 16
        stop[1] = 1
        with pytest.raises(cs.AccessDeniedError, match="only the control plane does"):
            bob.sync(op(bob.client.rpc(worker), WorkerOp.CONTROL), job=job.id, words=stop)
        with pytest.raises(cs.AccessDeniedError, match="through the scheduler's 'broadcast'"):
            bob.sync(
                bob.client.scheduler.broadcast,
                msg={"op": WorkerOp.CONTROL.handler, "job": job.id, "words": stop},
            )
        with pytest.raises(cs.AccessDeniedError, match="may not publish on"):
            bob.sync(
                bob.client.scheduler.log_event,
                topic=topic(job.id),
                msg={"kind": "status", "status": "FINISHED"},
            )
        assert job.status is cs.JobStatus.RUNNING
    finally:
        job.stop()
    # what the README's threat model says a credential holder may do: run code on workers
    assert set(bob.client.run(os.getpid).values()) == set(alice.client.run(os.getpid).values())
    assert alice.client.run_on_scheduler(os.getpid) == os.getpid()  # the admin may


def cs_agent():
    from clustersdk.runtime.agent import Agent

    return Agent()


def test_a_removed_user_is_refused_at_once(alice, tmp_path):
    path = alice.add_user("carol", path=str(tmp_path / "carol.pem"))
    carol = cs.Cluster.connect(
        alice.scheduler_address, credentials=path, state_dir=str(tmp_path / "carol-state")
    )
    try:
        assert carol.whoami()["name"] == "carol" and carol.jobs() is not None
        alice.remove_user("carol")
        assert alice.users()["carol"]["revoked"]
        with pytest.raises(cs.AccessDeniedError, match="certificate of 'carol'.*was revoked"):
            carol.jobs()  # on the connection she opened before
    finally:
        carol.close()
    with pytest.raises(cs.SpecError, match="could not reach a Dask scheduler"):
        cs.Cluster.connect(alice.scheduler_address, credentials=path, timeout=3)
    # the workers and nannies refuse her certificate too (their handshakes check the list)
    for target in targets(alice)[1:]:
        role, _, address = target.partition("=")
        answer = asyncio.run(
            security_probe.attempt(role, address, "tls-other-ca", str(tmp_path / "m"), path)
        )
        assert answer.startswith("refused"), (target, answer)


def test_without_tls_the_cluster_warns_once_strangers_get_in_and_the_doctor_says_so(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(tls, "_warned", False)
    with pytest.warns(cs.InsecureClusterWarning, match="plain tcp://"):
        cluster = cs.Cluster.local(workers=1, state_dir=str(tmp_path), security=False)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            tls.cluster_security(False, state_dir=str(tmp_path), kind="local")  # once only
        # what the TLS cluster above refuses: here the stranger's code runs
        other = Authority.create(str(tmp_path / "other"), admin="mallory")
        marker = tmp_path / "stranger-was-here"
        answers = probe(cluster, marker, other.credentials_file("mallory"))
        assert answers[f"scheduler {cluster.scheduler_address} tcp"].startswith("ANSWERED")
        assert marker.exists()
        report = cluster.doctor(bandwidth=False)
        assert any(
            p.check == "security" and "listens on plain tcp://" in p.message
            for p in report.problems
        ), report.problems
    finally:
        cluster.close()


def test_the_doctor_reports_readable_keys_and_certificates_near_their_end(tmp_path):
    from clustersdk.doctor.report import Report, security_problems
    from clustersdk.security.pki import file_facts

    ca = Authority.create(str(tmp_path / "tls"), admin="alice", days=3)
    os.chmod(ca.worker_file, 0o644)
    facts = file_facts([ca.ca_file, ca.worker_file, ca.crl_file])
    report = Report(
        [{"host": "h1", "tls": facts}],
        {},
        {},
        {},
        [],
        tls={"address": "tls://h1:8786", "files": []},
    )
    messages = [p.message for p in security_problems(report)]
    assert (
        f"host h1: {ca.worker_file} holds a private key and can be read by other users "
        f"(mode 644): whoever reads it acts as its holder; chmod 600 {ca.worker_file}" in messages
    )
    assert sum("expires in 3.0 days" in m for m in messages) == 2  # the CA's, the worker's
    os.chmod(ca.worker_file, 0o600)
    report.workers[0]["tls"] = file_facts([ca.ca_file, ca.worker_file, ca.crl_file])
    assert security_problems(report, now=0) == []


def test_bobs_dashboard_of_alices_job_greys_every_button_out(alice, bob):
    pytest.importorskip("ipywidgets")
    from clustersdk.widgets.job import JobDashboard

    job = alice.launch(workloads.spin, world_size=1, name="dashboards")
    try:
        wait_for(lambda: job.status is cs.JobStatus.RUNNING, timeout=60)
        his = JobDashboard(cs.Job.attach(bob, "dashboards"))
        assert all(b.disabled for b in his.buttons.values())
        assert his.buttons["stop"].tooltip == (
            "This job belongs to 'alice'; only its owner or an admin may change it (you are 'bob')"
        )
        hers = JobDashboard(job)
        assert not hers.buttons["stop"].disabled and not hers.buttons["pause"].disabled
    finally:
        job.stop()


def test_the_cluster_magic_connects_with_credentials_and_starts_without_tls_only_when_told(
    alice, bob
):
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "clustersdk")
    bob_file = bob.credentials
    cluster = shell.run_line_magic(
        "cluster", f"connect {alice.scheduler_address} --credentials {bob_file}"
    )
    try:
        assert cluster.whoami()["name"] == "bob"
    finally:
        shell.run_line_magic("cluster", "close")
    with pytest.raises(UsageError, match="--credentials is for %cluster connect"):
        shell.run_line_magic("cluster", f"local --credentials {bob_file}")


def test_hidden_metrics_stay_with_their_owner(tmp_path):
    with dask.config.set(
        {"clustersdk.security.user": "alice", "clustersdk.security.hide-metrics": True}
    ):
        alice = cs.Cluster.local(workers=1, state_dir=str(tmp_path / "alice"))
    try:
        path = alice.add_user("bob", path=str(tmp_path / "bob.pem"))
        job = alice.launch(workloads.spin, world_size=1, name="private")
        wait_for(lambda: len(job.history()) >= 3, timeout=60)  # its owner reads them
        with cs.Cluster.connect(
            alice.scheduler_address, credentials=path, state_dir=str(tmp_path / "bob")
        ) as bob:
            assert bob.whoami()["hide_metrics"] is True
            his = bob.job("private")  # the job and its record: visible
            assert his.status is cs.JobStatus.RUNNING and his.owner == "alice"
            for read in (his.history, his.logs, his.stacks):
                with pytest.raises(
                    cs.AccessDeniedError, match="may not see the metrics of job 'private'"
                ):
                    read()
            his.watch()  # subscribing to its topic gets him nothing either
            wait_for(lambda: len(job.history()) >= 10, timeout=60)
            assert his.latest == {}
        job.stop()
    finally:
        alice.close()


def test_the_cli_adds_lists_and_removes_users(alice, tmp_path):
    env = {**os.environ, "DASK_CLUSTERSDK__STATE_DIR": alice.state_dir}  # alice's registry

    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "clustersdk", "cluster", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    out = tmp_path / "dave.pem"
    added = cli("add-user", "dave", "--out", str(out))
    assert added.returncode == 0, added.stderr
    assert added.stdout.splitlines()[0] == str(out) and stat.S_IMODE(os.stat(out).st_mode) == 0o600
    assert read_credentials(str(out)).name == "dave"
    again = cli("add-user", "dave")
    assert again.returncode == 1 and "'dave' already has credentials" in again.stderr
    listed = json.loads(cli("users", "--json").stdout)
    assert listed["dave"]["role"] == "user" and listed["alice"]["role"] == "admin"
    removed = cli("remove-user", "dave", "--cluster", alice.scheduler_address)
    assert removed.returncode == 0, removed.stderr
    assert "revoked the credentials of 'dave'" in removed.stdout
    with pytest.raises(cs.SpecError, match="could not reach a Dask scheduler"):
        cs.Cluster.connect(alice.scheduler_address, credentials=str(out), timeout=3)
