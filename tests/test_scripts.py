"""Script jobs (``cluster.launch_script``): the scripts people already run under torchrun,
unmodified, on a local cluster of four CPU slots; the scripts are in ``tests/scripts``.

What a user would notice: the same parameters as ``torchrun``, every rank's lines in its
log, torchrun's environment, a failing rank's exit code in the cause and the restart,
pause / checkpoint / suspend through ``clustersdk.script``, a frozen rank found HUNG with
every rank's stack, preemption by SIGTERM, and ``clustersdk submit --follow``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import clustersdk as cs
from clustersdk import JobFailedError, JobStatus

from .helpers import wait_for

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "scripts"
DDP = str(SCRIPTS / "ddp_train.py")
STEPPER = str(SCRIPTS / "stepper.py")
FAULTY = str(SCRIPTS / "faulty.py")


def step_of(job: cs.Job) -> int:
    return max((r["step"] for r in job.history()), default=0)


def torchrun(script: str, args: list[str], nproc: int, tmp: Path) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node N script args`` on this machine (the reference)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "RANK"))}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(nproc),
            "--standalone",
            script,
            *args,
        ],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )


def test_a_ddp_script_runs_unmodified_and_ends_as_under_torchrun(idle4, tmp_path):
    ours, theirs = tmp_path / "ours.pt", tmp_path / "theirs.pt"
    args = ["--steps", "12", "--out"]
    job = idle4.launch_script(DDP, [*args, str(ours)], world_size=3, name="ddp-script")
    ref = torchrun(DDP, [*args, str(theirs)], 3, tmp_path)
    assert job.wait(timeout=120) == 0 and job.status is JobStatus.FINISHED
    a, b = torch.load(ours), torch.load(theirs)
    for key in b:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6)
    # every rank's lines are its log, the loss of each step as the script printed it
    for rank in range(3):
        text = job.logs(rank)
        assert [int(s) for s in re.findall(rf"rank {rank} step (\d+) loss", text)] == list(
            range(12)
        )
        assert f"rank {rank} done env LOCAL_RANK={rank} RESTART=0" in text
    # (torchrun's ranks share one stdout: their lines can run into each other)
    theirs_losses = re.findall(r"rank 1 step \d+ loss (\d+\.\d{6})", ref.stdout)
    assert re.findall(r"rank 1 step \d+ loss (\d+\.\d{6})", job.logs(1)) == theirs_losses
    assert job.spec.kind == "script" and job.spec.fn == "ddp_train.py"


ENV_PROBE = """
import json, os, sys
keys = sys.argv[1].split(",")
env = json.dumps({k: os.environ.get(k) for k in keys})
print("ENV " + env, flush=True)
if len(sys.argv) > 2:  # torchrun's ranks share one stdout pipe: their lines can merge there
    with open(os.path.join(sys.argv[2], os.environ["RANK"] + ".json"), "w") as f:
        f.write(env)
"""

TORCHRUN_KEYS = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
]
PRESENT_KEYS = [
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "CLUSTERSDK_JOB",
    "CLUSTERSDK_CHECKPOINT_DIR",
]


def test_each_rank_has_torchrun_s_environment(idle4, tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(ENV_PROBE)
    keys = ",".join(TORCHRUN_KEYS + PRESENT_KEYS)
    job = idle4.launch_script(
        str(probe),
        [keys],
        world_size=2,
        name="env-probe",
        checkpoint_dir=str(tmp_path / "ck"),
        working_dir=str(tmp_path),
    )
    assert job.wait(timeout=120) == 0
    (tmp_path / "ref").mkdir()
    torchrun(str(probe), [keys, str(tmp_path / "ref")], 2, tmp_path)
    theirs = [json.loads((tmp_path / "ref" / f"{rank}.json").read_text()) for rank in range(2)]
    for rank in range(2):
        ours = json.loads(job.logs(rank).split("ENV ", 1)[1].splitlines()[0])
        assert {k: ours[k] for k in TORCHRUN_KEYS} == {k: theirs[rank][k] for k in TORCHRUN_KEYS}
        assert all(ours[k] for k in PRESENT_KEYS), ours
        assert ours["CLUSTERSDK_JOB"] == "env-probe"
        assert ours["CLUSTERSDK_CHECKPOINT_DIR"] == str(tmp_path / "ck")
        assert ours["TORCHELASTIC_RUN_ID"] == job.id


def test_a_rank_that_exits_3_restarts_the_gang_once_and_the_job_finishes(idle4):
    job = idle4.launch_script(
        FAULTY, ["--rank", "1", "--code", "3"], world_size=3, max_restarts=1, name="exits-once"
    )
    assert job.wait(timeout=120) == 0
    assert job.restarts == 1
    restarted = [e for e in job.events() if e["kind"] == "restarted"]
    assert len(restarted) == 1
    assert restarted[0]["rank"] == 1 and restarted[0]["exit_code"] == 3
    assert (
        "rank 1 (host 127.0.0.1, CPU) exited with code 3; restart 1 of 1" in restarted[0]["message"]
    )
    assert "rank 0 finished attempt 1" in job.logs(0)


def test_without_restarts_the_exit_code_is_the_cause(idle4):
    job = idle4.launch_script(
        FAULTY, ["--rank", "1", "--code", "3"], world_size=3, name="exits-fails"
    )
    with pytest.raises(JobFailedError) as failed:
        job.wait(timeout=120)
    e = failed.value
    assert e.rank == 1 and e.exc_type == "ScriptExit" and e.message == "exited with code 3"
    assert "job 'exits-fails' failed: rank 1 (host 127.0.0.1, CPU) exited with code 3" in str(e)
    assert "rank 1: the disk is on fire" in e.traceback  # the last lines of its stderr
    # the others were ended by the failure (SIGTERM), not counted as failures of their own
    assert job.info()["error"].get("consequences", []) == []


def test_a_raise_under_record_names_the_exception_from_the_error_file(idle4):
    job = idle4.launch_script(FAULTY, ["--rank", "2", "--raise"], world_size=3, name="raises")
    with pytest.raises(JobFailedError) as failed:
        job.wait(timeout=120)
    e = failed.value
    assert (e.rank, e.exc_type, e.message) == (2, "ValueError", "bad batch 7 (exited with code 1)")
    assert 'raise ValueError("bad batch 7")' in e.traceback


def test_pause_checkpoint_suspend_and_resume_at_step_boundaries(idle4, tmp_path):
    ck = tmp_path / "ck"
    job = idle4.launch_script(
        STEPPER,
        ["--control", "--steps", "40", "--sleep", "0.05"],
        world_size=2,
        checkpoint_dir=str(ck),
        name="stepper",
    )
    wait_for(lambda: step_of(job) >= 3, timeout=60)
    assert sorted(job.info()["controls"]) == ["checkpoint", "pause", "stop", "suspend"]
    assert job.checkpoint(timeout=30) == str(ck / "state.pt")
    assert job.info()["checkpoint_step"] >= 3
    paused_at = job.pause(timeout=30)
    assert job.status is JobStatus.PAUSED
    time.sleep(0.5)
    assert step_of(job) == paused_at  # it waits there
    with pytest.raises(cs.InvalidTransitionError, match="resume it first"):
        job.checkpoint(timeout=5)
    job.resume()
    wait_for(lambda: step_of(job) >= paused_at + 3, timeout=60)
    job.suspend(timeout=60)
    assert job.status is JobStatus.SUSPENDED
    left = step_of(job)
    assert f"rank 0 leaves at step {left}" in job.logs(0)
    job.resume()
    assert job.wait(timeout=120) == 0
    assert f"rank 0 resumed at step {left}" in job.logs(0)
    rows = [r for r in job.history() if r["rank"] == 0]
    assert [r["step"] for r in rows] == list(range(1, 41))  # each step once, in order


def test_requests_a_script_did_not_opt_into_are_refused(idle4):
    job = idle4.launch_script(DDP, ["--steps", "400"], world_size=2, name="no-opt-in")
    wait_for(lambda: "step 3 " in job.logs(0), timeout=60)
    with pytest.raises(cs.InvalidTransitionError, match="does not accept pause requests"):
        job.pause(timeout=5)
    with pytest.raises(cs.SpecError, match="job.run needs a training function"):
        job.run(lambda ctx: 1)
    assert job.status is JobStatus.RUNNING
    assert job.stop(timeout=60) is JobStatus.STOPPED  # by SIGTERM


@pytest.mark.skipif(
    shutil.which(
        "py-spy",
        path=os.pathsep.join([os.environ.get("PATH", ""), os.path.dirname(sys.executable)]),
    )
    is None,
    reason="py-spy (clustersdk[scripts]) is not installed",
)
def test_a_sigstopped_rank_is_hung_with_every_rank_s_stack_and_stop_ends_it(idle4):
    job = idle4.launch_script(
        STEPPER,
        ["--steps", "100000", "--sleep", "0.02"],
        world_size=3,
        hang_timeout=3,
        name="frozen",
        grace=5,
    )
    wait_for(lambda: step_of(job) >= 3, timeout=60)
    pid = int(re.search(r"rank 1 pid (\d+)", job.logs(1)).group(1))
    os.kill(pid, signal.SIGSTOP)
    try:
        frozen = time.monotonic()
        wait_for(lambda: job.status is JobStatus.HUNG, timeout=6)
        assert time.monotonic() - frozen <= 2 * 3
        stacks = job.stacks()
        assert sorted(stacks) == [0, 1, 2]
        assert "stopped (SIGSTOP)" in stacks[1]
        for rank in range(3):
            assert "main (stepper.py:" in stacks[rank], stacks[rank]
        assert "hung" in job.info()["reason"]
        assert job.stop(timeout=30) is JobStatus.STOPPED
    finally:
        os.kill(pid, signal.SIGCONT) if _alive(pid) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def reference_params(steps: int, world: int) -> dict[str, torch.Tensor]:
    """stepper.py's uninterrupted run, in this process: DDP's averaged gradient is the
    gradient of the ranks' mean loss."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import stepper
    finally:
        sys.path.remove(str(SCRIPTS))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for step in range(steps):
        loss = (
            sum(
                torch.nn.functional.mse_loss(model(x), y)
                for x, y in (stepper.batch(step, r) for r in range(world))
            )
            / world
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.state_dict()


def test_a_preempted_script_saves_on_sigterm_comes_back_and_ends_the_same(idle4, tmp_path):
    out = tmp_path / "final.pt"
    low = idle4.launch_script(
        STEPPER,
        ["--sigterm", "--steps", "30", "--sleep", "0.05", "--out", str(out)],
        world_size=3,
        priority="low",
        checkpoint_dir=str(tmp_path / "ck"),
        name="low",
    )
    wait_for(lambda: step_of(low) >= 3, timeout=60)
    high = idle4.launch_script(DDP, ["--steps", "3"], world_size=2, priority="high", name="high")
    assert high.wait(timeout=120) == 0
    assert low.wait(timeout=180) == 0
    kinds = [e["kind"] for e in low.events()]
    assert "preempted" in kinds
    assert "saved on SIGTERM" in low.logs(0) and "resumed at step" in low.logs(0)
    ours, ref = torch.load(out), reference_params(30, 3)
    for key in ref:
        torch.testing.assert_close(ours[key], ref[key], rtol=0, atol=1e-6)


def test_clustersdk_submit_runs_a_script_and_follows_its_lines(idle4, tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT), str(ROOT / "extension"), os.environ.get("PYTHONPATH", "")]
        ),
        "DASK_CLUSTERSDK__STATE_DIR": idle4.state_dir,
    }  # its registry: the TLS credentials
    cmd = [
        sys.executable,
        "-m",
        "clustersdk",
        "submit",
        "--address",
        idle4.scheduler_address,
        "--world-size",
        "2",
        "--name",
        "from-a-terminal",
        "--follow",
        DDP,
        "--",
        "--steps",
        "4",
    ]
    # a terminal without the cluster's credentials is refused, in one line naming the fix
    elsewhere = {**env, "DASK_CLUSTERSDK__STATE_DIR": str(tmp_path / "nobody")}
    refused = subprocess.run(
        cmd, env=elsewhere, capture_output=True, text=True, timeout=180, cwd=tmp_path, check=False
    )
    assert refused.returncode == 1 and refused.stderr.startswith(
        "clustersdk submit: the scheduler at tls://"
    ), refused.stderr
    assert "wants credentials" in refused.stderr
    done = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "from-a-terminal"
    for rank in range(2):
        assert any(f"rank {rank} step 3 loss" in line for line in lines), done.stdout
    assert cs.Job.attach(idle4, "from-a-terminal").status is JobStatus.FINISHED


def test_the_notebook_magics_run_a_script_and_a_cell_as_torchrun_would(idle4, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "clustersdk")
    shell.user_ns["cluster"] = idle4
    try:
        ran = shell.run_cell(
            f"%run_distributed -n 2 --cluster cluster --name magic-script {DDP} --steps 2",
            store_history=False,
        )
        assert ran.success, ran.error_in_exec
        assert ran.result == 0
        out = capsys.readouterr().out
        assert "[rank 1] rank 1 step 1 loss" in out
        cell = (
            "import os\nimport sys\n"
            "print('hello from', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], "
            "sys.argv[1:])\n"
        )
        ran = shell.run_cell(
            f"%%torchrun -n 3 --cluster cluster --name magic-cell a b\n{cell}", store_history=False
        )
        assert ran.success, ran.error_in_exec
        out = capsys.readouterr().out
        for rank in range(3):
            assert f"[rank {rank}] hello from {rank} of 3 ['a', 'b']" in out
    finally:
        shell.user_ns.pop("cluster", None)
