"""A notebook's interrupt stops the cell, not the local cluster nor the job it runs.

Jupyter interrupts a kernel by signalling its whole process group (as a terminal's
Ctrl-C does): a real kernel, a real ``Cluster.local`` in it, and the kernel's own
interrupt, sent while a cell waits on the job.
"""

from __future__ import annotations

import json
import time

from jupyter_client.manager import start_new_kernel

SETUP = """
import time
import clustersdk as cs

cluster = cs.Cluster.local(workers=2, state_dir={state!r})

def train(ctx):
    total = 0
    for step, _ in ctx.loop(None, steps=80):  # about 4 s: still running when interrupted
        time.sleep(0.05)
        ctx.log(loss=float(step))
        total += step
    return total

job = cluster.launch(train, world_size=2)
while not job.history():
    time.sleep(0.05)
"""


def _run(kc, code: str, timeout: float = 120) -> tuple[dict, str]:
    """Run a cell; its reply's content and what it printed."""
    out: list[str] = []

    def hook(msg: dict) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return reply["content"], "".join(out)


def test_an_interrupted_cell_leaves_the_cluster_and_its_job_running(tmp_path):
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        reply, _ = _run(kc, SETUP.format(state=str(tmp_path / "state")))
        assert reply["status"] == "ok", reply
        waiting = kc.execute("job.wait()")
        time.sleep(0.5)  # the cell is in job.wait()
        km.interrupt_kernel()  # SIGINT to the kernel's process group, as JupyterLab sends
        deadline = time.monotonic() + 30
        while True:
            msg = kc.get_shell_msg(timeout=max(deadline - time.monotonic(), 0.1))
            if msg["parent_header"].get("msg_id") == waiting:
                break
        assert msg["content"]["status"] == "error"
        assert msg["content"]["ename"] == "KeyboardInterrupt"

        reply, printed = _run(
            kc,
            "import json\n"
            "print(json.dumps({'result': job.wait(timeout=120), 'status': job.status.value,"
            " 'restarts': job.restarts, 'slots': len(cluster.slots())}))",
        )
        assert reply["status"] == "ok", reply
        seen = json.loads(printed.strip().splitlines()[-1])
        assert seen == {"result": sum(range(80)), "status": "finished", "restarts": 0, "slots": 2}
    finally:
        try:
            _run(kc, "cluster.close()", timeout=60)
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
