"""SIGTERM on the real server: in-flight requests finish, new ones get 503, the process exits 0 (the drain
timeout case: tests/test_server_drain.py)."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest
from server_harness import SMALL_API_KEY, ServerProcess

pytestmark = pytest.mark.slow
OUTPUT_TOKENS = 24


def _wait_in_flight(server: ServerProcess, count: int) -> None:
    deadline = time.monotonic() + 20
    while httpx.get(server.url + "/get_server_info", timeout=5).json()["in_flight_requests"] < count:
        assert time.monotonic() < deadline, "the second request never arrived"
        time.sleep(0.05)


def test_sigterm_drains_in_flight_requests(small_server: ServerProcess) -> None:
    headers = {"Authorization": f"Bearer {SMALL_API_KEY}"}
    body = {
        "prompt": "Write a poem about the sea.",
        "max_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    plain = {"prompt": "Count to ten:", "max_tokens": 12, "ignore_eos": True}
    plain_result: dict[str, httpx.Response] = {}
    lines: list[str] = []
    assert small_server.proc is not None

    def non_streamed() -> None:
        plain_result["r"] = httpx.post(
            small_server.url + "/v1/completions", json=plain, headers=headers, timeout=120
        )

    with httpx.stream(
        "POST", small_server.url + "/v1/completions", json=body, headers=headers, timeout=120
    ) as r:
        assert r.status_code == 200
        worker = threading.Thread(target=non_streamed)
        worker.start()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            lines.append(line)
            if len(lines) == 2:  # generation is under way: ask the server to stop
                _wait_in_flight(small_server, 2)
                small_server.proc.send_signal(signal.SIGTERM)
                time.sleep(0.5)
                # Draining: the listener stays open; /health turns 503 so a router stops sending work.
                assert httpx.get(small_server.url + "/health", timeout=5).status_code == 503
        worker.join(timeout=120)

    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["usage"]["completion_tokens"] == OUTPUT_TOKENS
    assert plain_result["r"].status_code == 200
    assert plain_result["r"].json()["usage"]["completion_tokens"] == 12
    assert small_server.proc.wait(timeout=60) == 0
    assert "draining" in small_server.log()
