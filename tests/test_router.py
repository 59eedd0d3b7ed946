"""Scale-out: two real replicas behind ``sglang-router`` (SGLang Model Gateway) with cache_aware routing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_harness import SMALL_API_KEY, ServerProcess, free_port

pytestmark = pytest.mark.slow
pytest.importorskip("sglang_router")
openai = pytest.importorskip("openai")

MODEL = "SmolLM2-135M-Instruct"
HEADERS = {"Authorization": f"Bearer {SMALL_API_KEY}"}


# Failover settings (docs/serving.md): the circuit opens after 3 failed sends, fewer than the 5 attempts
# a request gets, so a retry leaves a dead replica instead of trying it 5 times (the defaults open it
# after 10, which lets a lone request fail with a 500); health checks every 2 s drop it for good.
FAILOVER_ARGS = [
    "--retry-max-retries",
    "5",
    "--cb-failure-threshold",
    "3",
    "--health-check-interval-secs",
    "2",
    "--health-failure-threshold",
    "2",
]


@pytest.fixture()
def router(smollm2_server: ServerProcess, small_server: ServerProcess) -> Iterator[str]:
    """``python -m sglang_router.launch_router`` over both replicas; yields its URL."""
    yield from _run_router([smollm2_server.url, small_server.url], [])


@pytest.fixture()
def failover_router(smollm2_server: ServerProcess, small_server: ServerProcess) -> Iterator[str]:
    """The router with :data:`FAILOVER_ARGS`."""
    yield from _run_router([smollm2_server.url, small_server.url], FAILOVER_ARGS)


def _run_router(workers: list[str], extra: list[str]) -> Iterator[str]:
    port = free_port()
    log_path = Path(tempfile.gettempdir()) / f"nibblekv-test-router-{port}.log"
    # --api-key: the router checks it on incoming requests and presents it to the workers (the small
    # replica requires it; the main one ignores it).
    cmd = [
        sys.executable,
        "-m",
        "sglang_router.launch_router",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *workers,
        "--policy",
        "cache_aware",
        "--api-key",
        SMALL_API_KEY,
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(free_port()),
        *extra,
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_routable(url, proc, log_path)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_routable(url: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    body = {"model": MODEL, "prompt": "warm up", "max_tokens": 1}
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"router exited with {proc.returncode}:\n{log_path.read_text(errors='replace')[-4000:]}"
            )
        try:
            if httpx.post(url + "/v1/completions", json=body, headers=HEADERS, timeout=30).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"router never routed a request:\n{log_path.read_text(errors='replace')[-4000:]}")


def _counter(server: ServerProcess, prefix: str) -> float:
    """Sum of a replica's Prometheus series starting with ``prefix``."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def _post_together(router: str, prompts: list[str], max_tokens: int) -> list[dict[str, Any]]:
    """Send ``prompts`` concurrently through the router; all must succeed."""

    async def run() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=router, headers=HEADERS, timeout=120) as client:
            rs = await asyncio.gather(
                *(
                    client.post(
                        "/v1/completions", json={"model": MODEL, "prompt": p, "max_tokens": max_tokens}
                    )
                    for p in prompts
                )
            )
        for r in rs:
            assert r.status_code == 200, r.text
        return [r.json() for r in rs]

    return asyncio.run(run())


def test_two_replicas_answer_through_the_router(
    router: str, smollm2_server: ServerProcess, small_server: ServerProcess
) -> None:
    requests = "nibblekv:num_requests_total{"
    before = (_counter(smollm2_server, requests), _counter(small_server, requests))
    # Unrelated prompts at once: with no cached prefix, cache_aware picks the less loaded replica.
    topics = ["Volcanoes", "Quantum", "Baking", "Medieval"]
    outs = _post_together(router, [f"{t} are interesting because" for t in topics], max_tokens=6)
    assert all(o["usage"]["completion_tokens"] == 6 for o in outs)
    gained = (_counter(smollm2_server, requests) - before[0], _counter(small_server, requests) - before[1])
    assert sum(gained) == len(topics) and min(gained) >= 1, gained

    client = openai.OpenAI(base_url=router + "/v1", api_key=SMALL_API_KEY, max_retries=0, timeout=60)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi!"}], max_tokens=3
    )
    assert chat.choices[0].message.content is not None
    streamed = list(
        client.completions.create(model=MODEL, prompt="Streaming via the router", max_tokens=3, stream=True)
    )
    assert streamed[-1].choices[0].finish_reason == "length"


def test_shared_prefixes_stick_to_one_replica_each(
    router: str, smollm2_server: ServerProcess, small_server: ServerProcess
) -> None:
    """Two prompt families sent in concurrent pairs: each family stays on the replica that cached it."""
    family_x = "You are a meticulous assistant for the Riverside Library catalogue. " * 6
    family_y = "Act as a terse ship's navigator who answers in bearings only; never explain. " * 3
    tokens = "nibblekv:prompt_tokens_total"
    before = (_counter(smollm2_server, tokens), _counter(small_server, tokens))
    sent = {"x": 0, "y": 0}
    for q in range(3):
        outs = _post_together(router, [f"{family_x}Question {q}: where is", f"{family_y}Heading {q}:"], 1)
        sent["x"] += outs[0]["usage"]["prompt_tokens"]
        sent["y"] += outs[1]["usage"]["prompt_tokens"]
    assert sent["x"] != sent["y"]
    gained = {_counter(smollm2_server, tokens) - before[0], _counter(small_server, tokens) - before[1]}
    # Neither family was split across replicas. Both may share one: when the first pair arrives the
    # replicas tie on load and the router may send both there; cache-aware routing then keeps them.
    together = {sent["x"] + sent["y"], 0}
    assert gained in ({sent["x"], sent["y"]}, together), (gained, sent)


async def _send(client: httpx.AsyncClient, i: int, max_tokens: int = 4) -> tuple[int, str]:
    """One request of prompt family ``i % 6`` (streamed for odd ``i``): (status, detail); a stream counts
    as 200 only if it ends with ``[DONE]``, a transport error as -1."""
    prompt = f"Family {i % 6}: " + "notes on the harbour and its ships " * 12 + f"question {i}"
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    try:
        if i % 2:
            async with client.stream("POST", "/v1/completions", json=body | {"stream": True}) as r:
                if r.status_code != 200:
                    return r.status_code, (await r.aread()).decode(errors="replace")[:200]
                lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
            return (200, "") if lines and lines[-1] == "data: [DONE]" else (-1, str(lines[-2:]))
        r = await client.post("/v1/completions", json=body)
        return r.status_code, r.text[:200] if r.status_code != 200 else ""
    except httpx.HTTPError as exc:
        return -1, repr(exc)


def test_killing_a_replica_loses_no_new_request(failover_router: str, small_server: ServerProcess) -> None:
    """SIGKILL one replica while requests run: every request sent afterwards succeeds (retried on the
    live replica), one by one, where the router's defaults answer some with a 500, and concurrently."""
    assert small_server.proc is not None

    async def run() -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
        async with httpx.AsyncClient(base_url=failover_router, headers=HEADERS, timeout=60) as client:
            for first in range(0, 6, 2):  # both replicas learn prompt families (cache_aware affinity)
                warm = await asyncio.gather(_send(client, first), _send(client, first + 1))
                assert all(code == 200 for code, _ in warm), warm
            in_flight = [asyncio.create_task(_send(client, 100 + i, max_tokens=64)) for i in range(3)]
            await asyncio.sleep(0.5)
            small_server.proc.kill()  # by PID, no drain
            small_server.proc.wait(timeout=10)
            after = [await _send(client, 200 + i) for i in range(6)]
            gate = asyncio.Semaphore(3)

            async def gated(i: int) -> tuple[int, str]:
                async with gate:
                    return await _send(client, i)

            after += await asyncio.gather(*(gated(300 + i) for i in range(9)))
            return after, await asyncio.gather(*in_flight)

    after, in_flight = asyncio.run(run())
    failed = [r for r in after if r[0] != 200]
    assert not failed, f"{len(failed)} of {len(after)} requests sent after the kill failed: {failed[:3]}"
    # Requests already streaming from the killed replica cannot be saved; the others finish.
    assert sum(code == 200 for code, _ in in_flight) >= 1, in_flight
