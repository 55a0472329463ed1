"""Every ```python block of the README and the documentation runs as written, and every
``clustersdk ...`` command line of their shell blocks is one the CLI's parser takes.

A page's blocks run in order, as a notebook's cells would (IPython, so magics and a
cell's last expression work), in a fresh process with a working directory and a
clustersdk state directory of their own. A block that cannot run on one machine without
a GPU (SSH hosts, Slurm, Kubernetes, a remote scheduler...) says so on the line before
it, in a MyST comment that the rendered page does not show::

    % skip-example: needs SSH hosts

Each skipped block is a skipped test here, named with its page, line and reason
(``pytest -rs`` lists them), so none is skipped silently.

A page whose examples go on from another page's (the page says so to its readers) names
it once, anywhere on the page; that page's blocks run first, in the same process::

    % examples-after: ../getting-started.md
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = re.compile(r"^%\s*skip-example:(.*)$")
AFTER = re.compile(r"^%\s*examples-after:\s*(\S+)\s*$", re.M)
FENCE = re.compile(r"^(`{3,})python\s*$")
TIMEOUT = 240  # a page: one local cluster (its start is most of it) and tiny jobs


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    code: str
    skip: str | None  # the reason, when the page marks it as not runnable here

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)
    return [ROOT / "README.md", *docs]


def blocks(path: Path) -> list[Block]:
    """The page's ```python blocks, in order, each with the skip reason written above it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    page = str(path.relative_to(ROOT))
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(opening.group(1)))
        marker = SKIP.match(lines[i - 1]) if i else None
        reason = marker.group(1).strip() if marker else None
        found.append(Block(page, i + 1, "\n".join(lines[i + 1 : end]) + "\n", reason))
        i = end + 1
    return found


def runnable(path: Path) -> list[Block]:
    """What runs for the page: the blocks of the page it goes on from, then its own."""
    before = AFTER.search(path.read_text(encoding="utf-8"))
    first = runnable((path.parent / before.group(1)).resolve()) if before else []
    own = [b for b in blocks(path) if b.skip is None]
    return first + own if own else []


ALL = [b for p in pages() for b in blocks(p)]
RUN = {str(p.relative_to(ROOT)): runnable(p) for p in pages() if runnable(p)}
SKIPPED = [b for b in ALL if b.skip is not None]

# In the fresh process: each block is a cell of one IPython shell; the first that fails
# names its page and line; every cluster the page made is closed at the end.
DRIVER = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance(colors="nocolor")
ok = True
for block in json.load(open(sys.argv[1])):
    print(f"--- {block['where']}", flush=True)
    if not shell.run_cell(block["code"]).success:
        print(f"FAILED: the block at {block['where']}", flush=True)
        ok = False
        break
import gc
import clustersdk as cs
for value in gc.get_objects():  # the namespace's clusters and the one %cluster made
    if isinstance(value, cs.Cluster):
        value.close()
sys.exit(0 if ok else 1)
"""


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted(RUN))
def test_the_pages_python_blocks_run_as_written(page, tmp_path):
    cells = tmp_path / "blocks.json"
    cells.write_text(json.dumps([{"where": b.where, "code": b.code} for b in RUN[page]]))
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "DASK_CLUSTERSDK__STATE_DIR": str(tmp_path / "state")}
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(cells)],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its cluster's processes too, for the kill below
    )
    try:
        out, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate()
        pytest.fail(f"{page}: still running after {TIMEOUT} s\n{out[-6000:]}")
    finally:
        try:  # whatever the page started and left behind
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    print(f"{page}: {len(RUN[page])} blocks in {time.monotonic() - started:.1f} s")
    assert process.returncode == 0, f"{page}:\n{out[-6000:]}"


@pytest.mark.parametrize("block", SKIPPED, ids=[b.where for b in SKIPPED])
def test_a_block_marked_as_not_runnable_here_says_why(block):
    assert block.skip, f"{block.where}: '% skip-example:' without a reason"
    pytest.skip(f"{block.where}: {block.skip}")


def test_every_skip_marker_stands_before_a_python_block():
    stray = []
    for path in pages():
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if SKIP.match(line) and not (i + 1 < len(lines) and FENCE.match(lines[i + 1])):
                stray.append(f"{path.relative_to(ROOT)}:{i + 1}")
    assert not stray, f"skip-example markers not right before a ```python block: {stray}"


def test_the_readme_and_getting_started_examples_run_here():
    # the first example a newcomer meets is never one of the skipped
    for page in ("README.md", "docs/getting-started.md"):
        assert page in RUN, f"{page} has no python block that runs"


# --- the command lines ----------------------------------------------------------------------
SHELL_FENCE = re.compile(r"^(`{3,})(bash|console|sh|shell)\s*$")


def command_lines() -> list[tuple[str, str]]:
    """Every ``clustersdk ...`` command of the README's and the docs' shell blocks: (where,
    the command); a console block's commands are its ``$`` lines."""
    found = []
    for path in pages():
        lines = path.read_text(encoding="utf-8").splitlines()
        page = str(path.relative_to(ROOT))
        fence = None
        for i, line in enumerate(lines):
            if fence is None:
                opening = SHELL_FENCE.match(line)
                fence = opening.groups() if opening else None
                continue
            if line.startswith(fence[0]):
                fence = None
                continue
            text = line.removeprefix("$ ") if fence[1] == "console" else line
            if fence[1] == "console" and not line.startswith("$ "):
                continue
            if text.startswith("clustersdk "):
                found.append((f"{page}:{i + 1}", text))
    return found


COMMANDS = command_lines()


def test_the_docs_show_the_command_line():
    assert len(COMMANDS) >= 30  # the CLI page, the team-cluster guide, scripts, deployment


@pytest.mark.parametrize("where,command", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_command_line_in_the_docs_is_one_the_cli_takes(where, command, capsys):
    import shlex

    from clustersdk.__main__ import parse

    words = shlex.split(command, comments=True)
    if ">" in words:  # a redirection: not the command's
        words = words[: words.index(">")]
    try:
        parse(words[1:])
    except SystemExit as e:
        assert e.code == 0, f"{where}: {command}\n{capsys.readouterr().err}"  # --version, --help
