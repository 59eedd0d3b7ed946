"""Real ``nibblekv serve`` processes (the bundled SmolLM2 on 127.0.0.1) for the server/router tests.

Fixtures (made visible to every test module by an import in ``conftest.py``):
``smollm2_server`` - the main server, started once per session (32 running requests, no key);
``small_server``   - a second replica with tight limits and an API key (401 / 503 / drain tests,
                     and the second worker behind the router), restarted if a test stopped it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

STARTUP_TIMEOUT_S = 240.0
SMALL_API_KEY = "test-secret-key"


def _no_radix_cache() -> list[str]:
    """``--disable-radix-cache`` where the engine has one: with no prefix cache holding pages, an idle
    engine must use zero KV tokens, which makes "no page leaked" an exact check."""
    from dataclasses import fields

    from nibblekv.config import EngineConfig

    return (
        ["--disable-radix-cache"] if "disable_radix_cache" in {f.name for f in fields(EngineConfig)} else []
    )


# Where the main server writes its tokenizer (``--export-tokenizer``) for the lm-eval recipe test.
TOKENIZER_DIR = Path(tempfile.gettempdir()) / f"nibblekv-test-tokenizer-{os.getpid()}"
MAIN_ARGS = [
    "--max-running-requests",
    "32",
    "--max-total-tokens",
    "16384",
    "--export-tokenizer",
    str(TOKENIZER_DIR),
    *_no_radix_cache(),
]
SMALL_ARGS = [
    "--max-running-requests",
    "2",
    "--max-queued-requests",
    "1",
    "--api-key",
    SMALL_API_KEY,
    "--max-total-tokens",
    "4096",
    "--drain-timeout",
    "60",
    "--skip-server-warmup",  # restarted by several tests; the main server runs the warm-up
    *_no_radix_cache(),
]


def free_port() -> int:
    """A TCP port that is free right now on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """One ``python -m nibblekv serve`` subprocess; its log goes to a temp file shown on failure."""

    def __init__(self, extra_args: list[str], name: str) -> None:
        self.extra_args = extra_args
        self.name = name
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(tempfile.gettempdir()) / f"nibblekv-test-{name}-{os.getpid()}.log"

    @property
    def url(self) -> str:
        """Root URL (``/v1`` not included)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Launch without waiting (see :meth:`wait_ready`)."""
        self.port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "nibblekv",
            "serve",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            *self.extra_args,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self) -> None:
        """Block until ``/health`` answers 200; fail with the server log if it dies or times out."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name} server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        pytest.fail(f"{self.name} server did not become healthy in {STARTUP_TIMEOUT_S} s:\n{self.log()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure_running(self) -> ServerProcess:
        """Restart if a test (the SIGTERM one) stopped it."""
        if not self.alive():
            self.start()
            self.wait_ready()
        return self

    def terminate(self, timeout: float = 90.0) -> int:
        """SIGTERM and wait; returns the exit code (SIGKILL after ``timeout``)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)

    def log(self) -> str:
        """The last part of the server's log."""
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return "(no log)"

    def engine_stats(self) -> dict[str, Any]:
        """The engine gauges from ``/get_server_info``."""
        stats: dict[str, Any] = httpx.get(self.url + "/get_server_info", timeout=10).json()["engine_stats"]
        return stats


class _Servers:
    """Both servers, each started the first time a test needs it (loading two at once on 2 cores
    is slower than one after the other)."""

    def __init__(self) -> None:
        self.main = ServerProcess(MAIN_ARGS, "main")
        self.small = ServerProcess(SMALL_ARGS, "small")

    def stop(self) -> None:
        for server in (self.main, self.small):
            if server.alive():
                server.terminate(timeout=30)


@pytest.fixture(scope="session")
def _servers(smollm2_path: Path) -> Iterator[_Servers]:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    servers = _Servers()
    yield servers
    servers.stop()


@pytest.fixture(scope="session")
def smollm2_server(_servers: _Servers) -> ServerProcess:
    """The main server (bundled SmolLM2, 32 running requests, no API key, no queue limit)."""
    return _servers.main.ensure_running()


@pytest.fixture()
def small_server(_servers: _Servers) -> ServerProcess:
    """The tight replica: 2 running + 1 queued request, API key ``SMALL_API_KEY``."""
    return _servers.small.ensure_running()


def wait_idle(server: ServerProcess, timeout: float = 60.0) -> dict[str, Any]:
    """Poll until the engine has nothing running or queued; returns the final stats."""
    deadline = time.monotonic() + timeout
    stats = server.engine_stats()
    while time.monotonic() < deadline:
        stats = server.engine_stats()
        if stats["running"] == 0 and stats["queued"] == 0:
            return stats
        time.sleep(0.2)
    return stats
