"""clustersdk.script on its own: a no-op outside a job; inside one (a process given a rank's
socket, here the test's), log sends rows, step waits while paused and hands out checkpoint
and stop requests, saved reports the checkpoint."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from clustersdk.protocol import Word, no_words
from clustersdk.runtime.channel import Channel

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        **kwargs,
    )


def test_outside_a_job_every_call_does_nothing():
    env = {k: v for k, v in os.environ.items() if k != "CLUSTERSDK_CONTROL"}
    proc = run_python(
        """
        import sys
        from clustersdk import script
        script.log(step=1, loss=0.5)
        todo = script.step(1, saves=True)
        script.saved("/x")
        print(bool(todo), script.in_job(), script.restarts(), script.checkpoint_dir(),
              "torch" in sys.modules)
    """,
        env={**env, "CLUSTERSDK_CONTROL": ""},
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.split() == ["False", "False", "0", "None", "False"]


class FakeRank:
    """The rank's end of the channel: reads the script's messages, sends control words."""

    def __init__(self, path: str):
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(1)
        self.server.settimeout(60)
        self.words = no_words()

    def accept(self) -> None:
        self.peer, _ = self.server.accept()
        self.line = Channel(self.peer)
        self.send()

    def send(self, **words: int) -> None:
        for name, value in words.items():
            self.words[Word[name]] = value
        self.line.send({"op": "words", "words": self.words})

    def next(self, op: str, event: str | None = None) -> dict:
        """The next message of kind ``op`` (a report: of ``event``); others are skipped."""
        while True:
            message = self.line.recv(timeout=60)
            assert isinstance(message, dict), message
            if message["op"] == op and (event is None or message["event"] == event):
                return message

    def close(self) -> None:
        self.peer.close()
        self.server.close()


def test_log_step_pause_checkpoint_and_stop_through_the_rank_s_socket(tmp_path):
    path = str(tmp_path / "control.sock")
    rank = FakeRank(path)
    proc = run_python(
        """
        import sys
        from clustersdk import script
        script.log(step=1, loss=0.5, acc=1)
        for step in range(2, 10**6):
            todo = script.step(step, saves=True)
            if todo.checkpoint:
                script.saved(f"/ck/{step}", step=step)
                print("saved", step, flush=True)
            if todo.stop:
                print("stop", step, todo.suspend, flush=True)
                break
    """,
        env={"CLUSTERSDK_CONTROL": path},
    )
    try:
        rank.accept()
        [row] = rank.next("rows")["rows"]
        assert (row["step"], row["scalars"]) == (1, {"loss": 0.5, "acc": 1.0})
        assert rank.next("report", "controls")["data"]["accepts"] == ["pause", "checkpoint"]
        rank.send(PAUSE=1)
        paused = rank.next("report", "paused")["data"]["step"]
        rank.send(CHECKPOINT=1)  # while paused: waits for the resume
        rank.send(RESUME=1)
        assert rank.next("report", "resumed")["data"]["step"] == paused
        saved = rank.next("report", "checkpoint")["data"]
        assert saved["seq"] == 1 and saved["path"] == f"/ck/{saved['step']}"
        rank.send(SUSPEND=1)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        rank.close()
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert lines[0] == f"saved {saved['step']}"
    assert lines[-2:] == [f"saved {lines[-1].split()[1]}", f"stop {lines[-1].split()[1]} True"]


def test_sigterm_after_opting_in_is_a_stop_at_the_next_boundary(tmp_path):
    path = str(tmp_path / "control.sock")
    rank = FakeRank(path)
    proc = run_python(
        """
        import os, signal
        from clustersdk import script
        for step in range(1, 10**6):
            todo = script.step(step)
            if step == 3:
                os.kill(os.getpid(), signal.SIGTERM)  # as the rank does for a stop
            if todo.stop:
                print("left at", step, todo.suspend, flush=True)
                break
    """,
        env={"CLUSTERSDK_CONTROL": path},
    )
    try:
        rank.accept()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        rank.close()
    assert proc.returncode == 0, err
    assert out.strip() == "left at 4 False"


def test_a_sigterm_ahead_of_its_suspend_words_is_still_a_suspend(tmp_path):
    """The rank writes the words, then signals; the signal can be handled before the
    listening thread read them. The boundary waits for them: the script saves and leaves
    as for a suspend, not a stop that saves nothing."""
    path = str(tmp_path / "control.sock")
    rank = FakeRank(path)
    proc = run_python(
        """
        import os, signal, sys
        from clustersdk import script
        for step in range(1, 10**6):
            todo = script.step(step, saves=True)
            if step == 3:
                os.kill(os.getpid(), signal.SIGTERM)
                print("signalled", flush=True)
                sys.stdin.readline()  # the test sends the words only now
            if todo.stop:
                print("left at", step, todo.suspend, todo.checkpoint, flush=True)
                break
    """,
        env={"CLUSTERSDK_CONTROL": path},
        stdin=subprocess.PIPE,
    )
    try:
        rank.accept()
        assert proc.stdout.readline() == "signalled\n"
        proc.stdin.write("\n")
        proc.stdin.flush()
        time.sleep(0.3)  # the boundary after step 3 is waiting for the words
        rank.send(SUSPEND=1)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        rank.close()
    assert proc.returncode == 0, err
    assert out.strip() == "left at 4 True True"
