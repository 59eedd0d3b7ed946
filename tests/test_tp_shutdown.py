"""``nibblekv generate --tp 2`` shuts down every rank: on SIGTERM, when a worker dies, when rank 0 is killed.

Each test runs the real CLI in a subprocess on a tiny dummy model, signals it mid-generation, and
checks that no process it started (workers, multiprocessing's helpers) outlives it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.test_tp import TINY

STARTUP_TIMEOUT_S = 120.0


def _launch(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path, list[psutil.Process]]:
    """Start a long greedy generation at --tp 2; return it once it decodes, with its descendants."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**TINY, "max_position_embeddings": 16384}))
    log = tmp_path / "stderr.txt"
    cmd = [
        sys.executable, "-m", "nibblekv", "generate", "--model", str(config), "--load-format", "dummy",
        "--tp", "2", "--max-new-tokens", "12000", "--ignore-eos", "--max-total-tokens", "16384",
        "--decode-log-interval", "20", "hello",
    ]  # fmt: skip
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while "Decode batch" not in log.read_text(errors="replace"):
        assert proc.poll() is None, f"generate exited early:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no decode step after {STARTUP_TIMEOUT_S}s:\n{log.read_text()}"
        time.sleep(0.2)
    family = psutil.Process(proc.pid).children(recursive=True)
    workers = [p for p in family if "spawn_main" in " ".join(p.cmdline())]
    assert len(workers) == 1, [p.cmdline() for p in family]
    return proc, log, family


def _assert_all_gone(procs: list[psutil.Process], timeout: float = 15.0) -> None:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"orphans: {[(p.pid, p.cmdline()) for p in alive]}"


def _wait(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def test_sigterm_to_rank0_stops_all_ranks(tmp_path: Path) -> None:
    proc, log, family = _launch(tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert _wait(proc) == 128 + signal.SIGTERM, log.read_text()
    _assert_all_gone(family)
    assert "did not stop" not in log.read_text()  # workers left on "stop", none had to be killed


def test_dead_worker_fails_rank0_and_leaves_no_orphans(tmp_path: Path) -> None:
    proc, log, family = _launch(tmp_path)
    worker = next(p for p in family if "spawn_main" in " ".join(p.cmdline()))
    worker.kill()
    code = _wait(proc, timeout=60)
    assert code not in (0, None), log.read_text()
    text = log.read_text()
    assert "tensor-parallel worker 1 died" in text, text
    _assert_all_gone(family)


def test_killed_rank0_takes_workers_down(tmp_path: Path) -> None:
    """SIGKILL runs no handler: the workers notice on their own (pipe EOF / parent watchdog)."""
    proc, _, family = _launch(tmp_path)
    proc.send_signal(signal.SIGKILL)
    _wait(proc)
    _assert_all_gone(family)
