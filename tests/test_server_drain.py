"""SIGTERM with generations that outlast the drain timeout: every stream gets a final ``finish_reason``
chunk and ``data: [DONE]``, a non-streaming request a 503 error, ``/health`` and new requests answer 503
during the drain, and the process exits 0 soon after the timeout with no traceback and no page in use."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_harness import ServerProcess, _no_radix_cache

pytestmark = pytest.mark.slow
psutil = pytest.importorskip("psutil")

DRAIN_TIMEOUT_S = 2.0
EXIT_SLACK_S = 5.0
STREAMS = 4
LONG = 1500  # tokens: far more than a CPU decodes in the drain timeout


@pytest.fixture()
def drain_server(smollm2_path: object) -> Iterator[ServerProcess]:
    """A server of its own (this test stops it), with a short drain timeout and info logging."""
    pytest.importorskip("uvicorn")
    args = ["--drain-timeout", str(DRAIN_TIMEOUT_S), "--log-level", "info", "--skip-server-warmup"]
    server = ServerProcess(
        [*args, "--max-running-requests", "8", "--max-total-tokens", "16384", *_no_radix_cache()], "drain"
    )
    server.start()
    try:
        server.wait_ready()
        yield server
    finally:
        if server.alive():
            server.terminate(timeout=10)


def _stream(url: str, i: int, out: dict[int, list[str]], started: threading.Event) -> None:
    """One long streaming request (completions or chat); keeps its ``data:`` lines."""
    body: dict[str, Any] = {"max_tokens": LONG, "ignore_eos": True, "stream": True}
    body["stream_options"] = {"include_usage": True}
    if i % 2:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": f"Story {i}:"}]
    else:
        path, body["prompt"] = "/v1/completions", f"Story {i}: once upon a time"
    lines: list[str] = []
    out[i] = lines
    with httpx.stream("POST", url + path, json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(line)
                if len(lines) >= 3:
                    started.set()


def _finish_reason(line: str) -> str | None:
    choices = json.loads(line[6:])["choices"]
    return choices[0]["finish_reason"] if choices else None


def test_sigterm_past_the_drain_timeout_ends_every_request_cleanly(drain_server: ServerProcess) -> None:
    url = drain_server.url
    assert drain_server.proc is not None
    lines: dict[int, list[str]] = {}
    plain: dict[str, httpx.Response] = {}
    flags = [threading.Event() for _ in range(STREAMS)]
    workers = [
        threading.Thread(target=_stream, args=(url, i, lines, flags[i]), daemon=True) for i in range(STREAMS)
    ]

    def non_streamed() -> None:
        body = {"prompt": "A long answer:", "max_tokens": LONG, "ignore_eos": True}
        plain["r"] = httpx.post(url + "/v1/completions", json=body, timeout=60)

    workers.append(threading.Thread(target=non_streamed, daemon=True))
    for w in workers:
        w.start()
    for flag in flags:
        assert flag.wait(timeout=60), "a stream never started"
    deadline = time.monotonic() + 10
    while httpx.get(url + "/get_server_info", timeout=5).json()["in_flight_requests"] < STREAMS + 1:
        assert time.monotonic() < deadline, "the non-streaming request never arrived"
        time.sleep(0.05)
    children = psutil.Process(drain_server.proc.pid).children(recursive=True)

    drain_server.proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    time.sleep(0.3)
    # Draining: the listener is still open, but nothing new is taken.
    assert httpx.get(url + "/health", timeout=5).status_code == 503
    late = httpx.post(url + "/v1/completions", json={"prompt": "late", "max_tokens": 2}, timeout=5)
    assert late.status_code == 503 and "shutting down" in late.json()["error"]["message"]

    code = drain_server.proc.wait(timeout=DRAIN_TIMEOUT_S + EXIT_SLACK_S)
    took = time.monotonic() - sent
    for w in workers:
        w.join(timeout=10)
    log = drain_server.log_path.read_text(errors="replace")
    assert code == 0, log[-3000:]
    assert DRAIN_TIMEOUT_S - 0.5 <= took <= DRAIN_TIMEOUT_S + EXIT_SLACK_S, took

    for i in range(STREAMS):  # cut at the timeout: a finish chunk ("abort"), usage, then [DONE]
        got = lines[i]
        assert got[-1] == "data: [DONE]", (i, got[-3:])
        reasons = [r for r in map(_finish_reason, got[:-1]) if r is not None]
        assert reasons == ["abort"], (i, got[-3:])
        usage = json.loads(got[-2][6:])["usage"]
        assert 0 < usage["completion_tokens"] < LONG
    assert plain["r"].status_code == 503, plain["r"].text
    assert plain["r"].json()["error"]["type"] == "service_unavailable_error"

    assert "Traceback" not in log and "CancelledError" not in log and "Cancel " not in log, log[-3000:]
    assert "drain timeout: aborting 5 requests still in flight" in log
    assert "engine at exit: 0 running, 0 queued, 0 KV tokens in use" in log, log[-3000:]
    assert not [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
