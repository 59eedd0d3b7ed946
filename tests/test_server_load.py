"""Load and abuse against the real server.

* 200 requests at concurrency 40, a fifth of the clients hanging up mid-stream (or, for non-streamed
  requests, before the answer): every other request is answered in full, the server stays healthy,
  and the engine ends with nothing running and no KV page in use (``nibblekv bench soak``, whose flags
  re-run the 1,000-request soak).
* The drain case (SIGTERM with streams cut at the drain timeout, each getting its final event):
  tests/test_server_drain.py.
* 120 malformed or hostile bodies: only 4xx, never a 5xx, and the server still answers afterwards.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from server_harness import ServerProcess

from nibblekv.bench.cli import main as bench_main
from nibblekv.bench.soak import SoakConfig, soak
from nibblekv.server.protocol import CompletionRequest

pytestmark = pytest.mark.slow

NUM_REQUESTS = 200
CONCURRENCY = 40
DISCONNECT_SHARE = 0.2  # every 5th client hangs up


def test_load_with_disconnects_leaks_nothing(smollm2_server: ServerProcess) -> None:
    """``nibblekv bench soak`` at a small size (the 1,000-request soak: docs/serving.md)."""
    cfg = SoakConfig(
        base_url=smollm2_server.url,
        num_requests=NUM_REQUESTS,
        concurrency=CONCURRENCY,
        disconnect_share=DISCONNECT_SHARE,
        idle_timeout=30,  # quitters asked for 400 tokens: only aborts end them this fast
    )
    report = asyncio.run(soak(cfg))
    quitters = round(NUM_REQUESTS * DISCONNECT_SHARE)
    assert not report.failures, report.failures[:5]
    assert report.disconnected == quitters and report.answered == NUM_REQUESTS - quitters
    assert report.healthy
    assert not report.leaks(allow_cached_tokens=False), report.idle_stats
    assert report.idle_stats["token_usage"] == 0.0
    # Every streamed quitter saw tokens, so its request was in the engine and must have been aborted;
    # an unstreamed one may (rarely) leave before its request got there, leaving nothing to abort.
    assert quitters // 2 <= report.aborted_requests <= quitters


def test_soak_cli_exit_code(smollm2_server: ServerProcess, tmp_path: Path) -> None:
    """The CLI as documented, small: exit 0 and a JSON report."""
    out = tmp_path / "soak.json"
    argv = ["soak", "--base-url", smollm2_server.url, "--num-requests", "12", "--concurrency", "6"]
    assert bench_main([*argv, "--output-file", str(out)]) == 0
    report = json.loads(out.read_text())["report"]
    assert report["answered"] + report["disconnected"] == 12 and not report["failures"]


def _valid(body: dict[str, Any]) -> bool:
    try:
        CompletionRequest.model_validate(body)
    except ValidationError:
        return False
    return True


def _hostile_bodies() -> list[tuple[str, bytes]]:
    """(path, raw body) pairs, every one invalid."""
    c, ch = "/v1/completions", "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    typed: list[tuple[str, dict[str, Any]]] = []
    wrong_values: list[Any] = [None, "x", [], {}, [1, "a"], {"a": 1}, -5, 1e308, "1" * 50]
    for field in (
        "max_tokens",
        "temperature",
        "top_p",
        "n",
        "logprobs",
        "seed",
        "stop",
        "stream",
        "echo",
        "top_k",
        "min_p",
        "stop_token_ids",
        "stream_options",
    ):
        for value in wrong_values:
            body = {"prompt": "hi", field: value}
            if _valid(body):
                continue  # e.g. null means "default" for most fields
            typed.append((c, body))
    huge = [
        (c, {"prompt": "hi", "max_tokens": 10**30}),
        (c, {"prompt": "hi", "n": 10**9}),
        (c, {"prompt": "hi", "max_tokens": 1e400}),
        (c, {"prompt": [2**40]}),
        (c, {"prompt": [-1]}),
        (c, {"prompt": [[1, 2], "mixed"]}),
        (c, {"prompt": 12345}),
        (c, {"prompt": None}),
        (ch, {"messages": [{"role": "user", "content": 5}]}),
        (ch, {"messages": [{"content": "no role"}]}),
        (ch, {"messages": msgs, "top_logprobs": 10**6}),
        (ch, {"messages": msgs, "max_completion_tokens": -3}),
        (ch, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]}),
        (ch, {"messages": msgs * 5000}),
        (c, {"prompt": "hi", "stop": ["s"] * 1000}),
    ]
    bodies = [(p, json.dumps(b).encode()) for p, b in typed + huge]
    raw = [
        (c, b""),
        (c, b"null"),
        (c, b"42"),
        (c, b'"str"'),
        (c, b"{"),
        (c, b"{'single': 1}"),
        (c, b'{"prompt": "\xc3\x28"}'),
        (c, b"\x80\x81\x82"),
        (c, b'{"prompt": "\\ud800"'),
        (c, b'{"prompt": "\\ud800 lone surrogate"}'),
        (ch, b'{"messages": [{"role": "user", "content": "\\udfff"}]}'),
        (c, b'{"prompt": "hi", "stop": ["\\ud800"]}'),
        (c, b"[" * 100_000 + b"]" * 100_000),
        (c, b'{"a":' * 5000 + b"1" + b"}" * 5000),
        (c, b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}"),
        (ch, b'{"messages": [' + b'{"role": "user", "content": "x"},' * 3 + b"]}"),
        (c, b'{"prompt": "hi", "temperature": Infinity}'),
        (c, b'{"prompt": "hi", "top_p": -Infinity}'),
        (c, b'{"prompt": "hi", "temperature": NaN}'),
    ]
    rng = random.Random(0)
    garbage = [
        (rng.choice([c, ch]), bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))))
        for _ in range(20)
    ]
    return bodies + raw + garbage


def test_fuzz_hostile_bodies_get_4xx(smollm2_server: ServerProcess) -> None:
    cases = _hostile_bodies()
    assert len(cases) >= 100
    failures = []
    with httpx.Client(base_url=smollm2_server.url, timeout=60) as client:
        for path, body in cases:
            r = client.post(path, content=body, headers={"content-type": "application/json"})
            if not 400 <= r.status_code < 500 or "error" not in r.json():
                failures.append((path, body[:80], r.status_code, r.text[:200]))
    assert not failures, failures[:5]
    ok = httpx.post(
        smollm2_server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}, timeout=60
    )
    assert ok.status_code == 200 and httpx.get(smollm2_server.url + "/health").status_code == 200
