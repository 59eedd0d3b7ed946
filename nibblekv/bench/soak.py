"""nibblekv bench soak: load with client disconnects against a running server, then a leak check.

--num-requests requests at --concurrency, mixed completions / chat and streamed / not; a
--disconnect-share of the clients ask for a long answer and hang up (streamed ones after two chunks,
the others after --quit-after seconds). Every other request must come back whole (--output-len tokens,
a stream ending in "data: [DONE]"). Afterwards the server must answer /health and, once idle, hold no
running or queued request, no in-flight HTTP request and (unless --allow-cached-tokens: a prefix cache
keeps pages by design) no KV token in use. Exit 0 when all of that holds, 1 otherwise; the summary is
printed and, with --output-file, written as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import httpx

QUITTER_TOKENS = 400  # long enough that a quitter is still generating when it hangs up


@dataclass(frozen=True)
class SoakConfig:
    """What to send."""

    base_url: str = "http://127.0.0.1:30000"
    num_requests: int = 1000
    concurrency: int = 48
    disconnect_share: float = 0.2
    output_len: int = 4
    quit_after: float = 1.0
    idle_timeout: float = 60.0
    allow_cached_tokens: bool = False
    api_key: str | None = None


# the help of each SoakConfig field's flag (``add_soak_args``)
FLAG_HELP: dict[str, str] = {
    "base_url": "server root URL",
    "num_requests": "requests in all",
    "concurrency": "requests in flight at once",
    "disconnect_share": "share of clients that hang up (0-1)",
    "output_len": "tokens each other request asks for",
    "quit_after": "seconds a non-streamed quitter waits",
    "idle_timeout": "seconds to wait for the server to go idle",
    "allow_cached_tokens": (
        "do not count KV tokens in use at the end as a leak (a prefix cache holds pages by design)"
    ),
    "api_key": "sent as 'Authorization: Bearer KEY'",
}
HELP = "load with client disconnects, then check the server leaked nothing"


@dataclass
class SoakReport:
    """What came back."""

    answered: int = 0
    disconnected: int = 0
    failures: list[str] = field(default_factory=list)
    aborted_requests: int = 0
    seconds: float = 0.0
    healthy: bool = False
    idle_stats: dict[str, Any] = field(default_factory=dict)
    in_flight_after: int = -1

    def leaks(self, allow_cached_tokens: bool) -> list[str]:
        """What the server still holds that it should not."""
        s = self.idle_stats
        found = [f"{k}={s.get(k)}" for k in ("running", "queued") if s.get(k) != 0]
        if not allow_cached_tokens and s.get("used_tokens") != 0:
            found.append(f"used_tokens={s.get('used_tokens')}")
        if self.in_flight_after != 0:
            found.append(f"in_flight_requests={self.in_flight_after}")
        return found

    def ok(self, allow_cached_tokens: bool) -> bool:
        return self.healthy and not self.failures and not self.leaks(allow_cached_tokens)


def _is_quitter(i: int, share: float) -> bool:
    """Spread quitters evenly: request ``i`` quits when the running share crosses a whole number."""
    return int((i + 1) * share) > int(i * share)


async def _normal(client: httpx.AsyncClient, i: int, cfg: SoakConfig) -> str | None:
    """A client that waits for its whole answer; None when it came back whole, else what went wrong."""
    body: dict[str, Any] = {"max_tokens": cfg.output_len, "ignore_eos": True, "temperature": 0.7, "seed": i}
    if i % 2:
        body["messages"] = [{"role": "user", "content": f"Request {i}: say something."}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = f"Request {i}: once upon a time"
        path = "/v1/completions"
    if i % 3 == 0:  # streamed, with usage at the end
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        async with client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                return f"request {i}: HTTP {r.status_code} {(await r.aread())[:200]!r}"
            lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        if not lines or lines[-1] != "data: [DONE]" or len(lines) < 2:
            return f"request {i}: stream did not end with [DONE]: {lines[-2:]}"
        tokens = json.loads(lines[-2][6:]).get("usage", {}).get("completion_tokens")
    else:
        r = await client.post(path, json=body)
        if r.status_code != 200:
            return f"request {i}: HTTP {r.status_code} {r.text[:200]}"
        tokens = r.json()["usage"]["completion_tokens"]
    return None if tokens == cfg.output_len else f"request {i}: {tokens} tokens, not {cfg.output_len}"


async def _quitter(client: httpx.AsyncClient, i: int, cfg: SoakConfig) -> None:
    """A client that asks for a long answer and hangs up early."""
    body = {"prompt": f"Quitter {i}: write a long essay", "max_tokens": QUITTER_TOKENS, "ignore_eos": True}
    if i % 2:
        async with client.stream("POST", "/v1/completions", json=body | {"stream": True}) as r:
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("data: ")
                if seen >= 2:
                    return  # leaving the block closes the connection mid-stream
        return
    try:
        await client.post("/v1/completions", json=body, timeout=cfg.quit_after)
    except httpx.TimeoutException:
        return


async def soak(cfg: SoakConfig) -> SoakReport:
    """Run the load, then the health and leak checks."""
    report = SoakReport()
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    limits = httpx.Limits(max_connections=cfg.concurrency + 8)
    base = cfg.base_url.rstrip("/").removesuffix("/v1")
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits, headers=headers) as client:
        before = (await client.get("/get_server_info")).json()["engine_stats"]["aborted_requests_total"]
        gate = asyncio.Semaphore(cfg.concurrency)

        async def one(i: int) -> None:
            async with gate:
                try:
                    if _is_quitter(i, cfg.disconnect_share):
                        await _quitter(client, i, cfg)
                        report.disconnected += 1
                        return
                    problem = await _normal(client, i, cfg)
                except httpx.HTTPError as exc:
                    problem = f"request {i}: {type(exc).__name__}: {exc}"
                if problem is None:
                    report.answered += 1
                else:
                    report.failures.append(problem)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(cfg.num_requests)))
        report.seconds = time.perf_counter() - t0
        report.healthy = (await client.get("/health")).status_code == 200
        deadline = time.monotonic() + cfg.idle_timeout
        while True:
            info = (await client.get("/get_server_info")).json()
            stats = info["engine_stats"]
            idle = stats["running"] == 0 and stats["queued"] == 0 and info["in_flight_requests"] == 0
            if idle or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        report.idle_stats = stats
        report.in_flight_after = int(info["in_flight_requests"])
        report.aborted_requests = int(stats["aborted_requests_total"]) - int(before)
    return report


def add_soak_args(p: argparse.ArgumentParser) -> None:
    """The ``bench soak`` flags: one per :class:`SoakConfig` field (its type and default), then
    ``--output-file``."""
    d = SoakConfig()
    for f in fields(SoakConfig):
        flag, default, help_text = "--" + f.name.replace("_", "-"), getattr(d, f.name), FLAG_HELP[f.name]
        if isinstance(default, bool):
            p.add_argument(flag, action="store_true", help=help_text)
        elif isinstance(default, (int, float)):
            p.add_argument(flag, type=type(default), default=default, help=help_text)
        else:
            p.add_argument(flag, default=default, help=help_text)
    p.add_argument("--output-file", default=None, help="write the report (and the config) as JSON here")


def config_from_args(args: argparse.Namespace) -> SoakConfig:
    """A :class:`SoakConfig` from parsed flags; a bad value is a one-line parser error."""
    parser: argparse.ArgumentParser = args._parser
    if args.num_requests < 1:
        parser.error(f"--num-requests must be at least 1, got {args.num_requests}")
    if args.concurrency < 1:
        parser.error(f"--concurrency must be at least 1, got {args.concurrency}")
    if not 0.0 <= args.disconnect_share <= 1.0:
        parser.error(f"--disconnect-share must be in [0, 1], got {args.disconnect_share}")
    if args.output_len < 1:
        parser.error(f"--output-len must be at least 1, got {args.output_len}")
    return SoakConfig(**{f.name: getattr(args, f.name) for f in fields(SoakConfig)})


def run(args: argparse.Namespace) -> int:
    """``bench soak``: 0 when every kept request came back whole and nothing leaked, else 1."""
    cfg = config_from_args(args)
    try:
        report = asyncio.run(soak(cfg))
    except httpx.HTTPError as exc:
        print(f"bench soak: cannot reach the server at {cfg.base_url}: {exc}")
        return 1
    leaks = report.leaks(cfg.allow_cached_tokens)
    print(
        f"{cfg.num_requests} requests at concurrency {cfg.concurrency} in {report.seconds:.1f} s: "
        f"{report.answered} answered in full, {report.disconnected} hung up, {len(report.failures)} failed; "
        f"{report.aborted_requests} engine requests aborted"
    )
    print(f"after: /health {'200' if report.healthy else 'not 200'}, leaks: {', '.join(leaks) or 'none'}")
    for problem in report.failures[:10]:
        print("  " + problem)
    if args.output_file:
        with open(args.output_file, "w") as f:
            json.dump({"config": asdict(cfg) | {"api_key": None}, "report": asdict(report)}, f, indent=2)
    return 0 if report.ok(cfg.allow_cached_tokens) else 1
