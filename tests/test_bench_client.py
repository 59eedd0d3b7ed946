"""``nibblekv bench serve`` against a tiny in-process OpenAI-style stub (no model needed).

The stub streams one word per chunk and records every body, so the tests can check what the client
sends (agentic history, ignore_eos, token ids) and that its statistics add up.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

uvicorn = pytest.importorskip("uvicorn")
starlette_apps = pytest.importorskip("starlette.applications")

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from nibblekv.bench import datasets as ds
from nibblekv.bench.client import RequestResult, Target
from nibblekv.bench.runner import LoadShape, num_requests, run_benchmark
from nibblekv.bench.stats import percentile, summarize

CHUNK_DELAY_S = 0.01


class Stub:
    """Records request bodies; answers with ``max_tokens`` words, one SSE chunk each, plus usage."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.in_flight = 0
        self.peak = 0

    async def _stream(self, body: dict[str, Any], chat: bool) -> Any:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            for i in range(int(body["max_tokens"])):
                await asyncio.sleep(CHUNK_DELAY_S)
                piece = f"w{i} "
                choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
                yield f"data: {json.dumps({'choices': [choice]})}\n\n"
            prompt = body.get("prompt") or body.get("messages")
            n_prompt = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
            usage = {
                "prompt_tokens": n_prompt,
                "completion_tokens": int(body["max_tokens"]),
                "prompt_tokens_details": {"cached_tokens": 1},
            }
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            self.in_flight -= 1

    async def completions(self, request: Request) -> Any:
        body = await request.json()
        self.bodies.append(body)
        if body.get("max_tokens") == 13:  # a request the tests want to fail
            return JSONResponse({"error": {"message": "nope", "code": 400}}, status_code=400)
        return StreamingResponse(self._stream(body, chat=False), media_type="text/event-stream")

    async def chat(self, request: Request) -> Any:
        body = await request.json()
        self.bodies.append(body)
        return StreamingResponse(self._stream(body, chat=True), media_type="text/event-stream")

    async def models(self, _: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "stub-model", "object": "model"}]})

    async def model_info(self, _: Request) -> JSONResponse:
        return JSONResponse({"vocab_size": 1000})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def stub() -> Iterator[tuple[Stub, str]]:
    """The stub served on 127.0.0.1 in a background thread; yields (stub, root URL)."""
    stub = Stub()
    app = starlette_apps.Starlette(
        routes=[
            Route("/v1/completions", stub.completions, methods=["POST"]),
            Route("/v1/chat/completions", stub.chat, methods=["POST"]),
            Route("/v1/models", stub.models),
            Route("/get_model_info", stub.model_info),
        ]
    )
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield stub, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def _run(
    root: str, requests: list[ds.BenchRequest], backend: str = "completions", **shape: Any
) -> tuple[list[RequestResult], float]:
    target = Target(root + "/v1", backend, "stub-model")
    return asyncio.run(run_benchmark(target, requests, LoadShape(progress=False, **shape)))


def test_random_lengths_are_fixed_or_ranged() -> None:
    fixed = ds.random_requests(20, 50, 7, 1.0, seed=0)
    assert all(len(str(r.prompt).split()) == 50 and r.output_len == 7 for r in fixed)
    ranged = ds.random_requests(200, 100, 40, 0.5, seed=0)
    ins = [len(str(r.prompt).split()) for r in ranged]
    assert min(ins) >= 50 and max(ins) <= 100 and len(set(ins)) > 10
    ids = ds.random_requests(5, 30, 4, 1.0, seed=0, vocab_size=500)
    assert all(isinstance(r.prompt, list) and len(r.prompt) == 30 and 100 <= min(r.prompt) for r in ids)
    assert (
        ds.random_requests(3, 30, 4, 1.0, seed=9)[0].prompt
        == ds.random_requests(3, 30, 4, 1.0, seed=9)[0].prompt
    )


def test_shared_prefix_groups_share_their_system_prompt() -> None:
    reqs = ds.shared_prefix_requests(3, 4, 40, 8, 5, seed=0)
    prefixes = {str(r.prompt).split("\n\n")[0] for r in reqs}
    assert len(reqs) == 12 and len(prefixes) == 3


def test_concurrency_cap_and_statistics(stub: tuple[Stub, str]) -> None:
    server, root = stub
    server.peak = 0
    reqs = ds.random_requests(24, 10, 5, 1.0, seed=1)
    results, duration = _run(root, reqs, max_concurrency=4)
    assert server.peak == 4  # never more than the cap, and the cap is reached
    m = summarize(results, duration)
    assert m["completed"] == 24 and m["failed"] == 0
    assert m["total_output_tokens"] == 24 * 5 and m["total_input_tokens"] == 24 * 10
    assert m["total_cached_tokens"] == 24
    assert 2.0 < m["concurrency"] <= 4.0
    assert all(len(r.itl) == 4 for r in results)  # 5 chunks -> 4 gaps
    assert m["mean_ttft_ms"] >= CHUNK_DELAY_S * 1000 * 0.9
    assert m["median_itl_ms"] >= CHUNK_DELAY_S * 1000 * 0.9
    assert all(
        b.get("ignore_eos") is True and b["stream_options"]["include_usage"] for b in server.bodies[-24:]
    )


def test_request_rate_spaces_arrivals(stub: tuple[Stub, str]) -> None:
    _, root = stub
    reqs = ds.random_requests(10, 5, 1, 1.0, seed=2)
    _, duration = _run(root, reqs, request_rate=20.0, seed=3)
    assert duration > 0.15  # 9 exponential gaps of mean 50 ms; all-at-once takes ~10 ms


def test_agentic_sessions_resend_history(stub: tuple[Stub, str]) -> None:
    server, root = stub
    sessions = ds.agentic_sessions(2, 3, 10, 6, 4, seed=0)
    assert num_requests(sessions) == 6
    before = len(server.bodies)
    results, _ = _run(root, sessions, backend="chat", max_concurrency=2)
    assert len(results) == 6 and all(r.success for r in results)
    bodies = server.bodies[before:]
    lengths = sorted(len(b["messages"]) for b in bodies)
    assert lengths == [2, 2, 4, 4, 6, 6]  # system+task, then + reply + tool output per turn
    last = max(bodies, key=lambda b: len(b["messages"]))
    assert last["messages"][2] == {"role": "assistant", "content": "w0 w1 w2 w3 "}
    assert last["messages"][-1]["content"].startswith("[tool output 2]")


def test_failures_are_reported_not_raised(stub: tuple[Stub, str]) -> None:
    _, root = stub
    results, duration = _run(root, [ds.BenchRequest("a b", 13), ds.BenchRequest("a b", 2)])
    m = summarize(results, duration)
    assert m["completed"] == 1 and m["failed"] == 1 and "HTTP 400" in m["errors"][0]


def test_percentile_matches_linear_interpolation() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert math.isclose(percentile(list(map(float, range(101))), 99), 99.0)
    assert percentile([], 99) == 0.0


def test_cli_writes_json_and_does_not_import_torch(stub: tuple[Stub, str], tmp_path: Path) -> None:
    _, root = stub
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text(
        '{"prompt": "hello there"}\n{"messages": [{"role": "user", "content": "hi"}], "output_len": 3}\n'
    )
    out = tmp_path / "run.json"
    # What `python -m nibblekv.bench` runs: the client alone (the `nibblekv` CLI also loads the engine's torch).
    code = (
        "import sys; from nibblekv.bench.cli import main; rc = main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'bench imported torch'; sys.exit(rc)"
    )
    args = [
        "serve",
        "--base-url",
        root,
        "--backend",
        "chat",
        "--dataset",
        "jsonl",
        "--dataset-path",
        str(jsonl),
        "--num-prompts",
        "2",
        "--random-output-len",
        "2",
        "--output-file",
        str(out),
    ]
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "Successful requests" in proc.stdout and "Median TTFT (ms)" in proc.stdout
    report = json.loads(out.read_text())
    assert report["completed"] == 2 and report["total_output_tokens"] == 5 and report["model"] == "stub-model"
