"""Sending one streamed request to an OpenAI-compatible server and timing its tokens."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from nibblekv.bench.datasets import as_messages, as_text


@dataclass(frozen=True)
class Target:
    """Where and how to send: base URL (``.../v1``), API flavour, model name and extra body fields."""

    base_url: str
    backend: str  # "completions" or "chat"
    model: str
    api_key: str | None = None
    ignore_eos: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestResult:
    """Timings and token counts of one request (``error`` set when it failed)."""

    success: bool = False
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)  # gaps between chunks that carried text
    text: str = ""
    error: str = ""
    start: float = 0.0  # perf_counter at send, for achieved concurrency

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (None for single-token outputs)."""
        if self.output_tokens <= 1:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def request_body(target: Target, prompt: Any, output_len: int) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) for one streamed request."""
    body: dict[str, Any] = {
        "model": target.model,
        "max_tokens": output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **target.extra_body,
    }
    if target.ignore_eos:
        body["ignore_eos"] = True  # vLLM / SGLang / nibblekv extension: exact output lengths
    if target.backend == "chat":
        return "/chat/completions", {**body, "messages": as_messages(prompt)}
    return "/completions", {**body, "prompt": as_text(prompt)}


async def sse_payloads(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON payloads of a server-sent-events stream, up to ``data: [DONE]``."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def _chunk_text(payload: dict[str, Any]) -> str:
    text = ""
    for choice in payload.get("choices") or []:
        delta = choice.get("delta")
        text += (delta.get("content") or "") if isinstance(delta, dict) else (choice.get("text") or "")
    return text


def _read_usage(result: RequestResult, usage: dict[str, Any]) -> None:
    result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    result.output_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    result.cached_tokens = int(details.get("cached_tokens") or 0)


async def send(client: httpx.AsyncClient, target: Target, prompt: Any, output_len: int) -> RequestResult:
    """Send one streamed request; never raises for server or network errors (they go in ``error``)."""
    path, body = request_body(target, prompt, output_len)
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    result = RequestResult(start=time.perf_counter())
    last = result.start
    chunks_with_text = 0
    try:
        async with client.stream("POST", target.base_url + path, json=body, headers=headers) as response:
            if response.status_code != 200:
                await response.aread()
                result.error = f"HTTP {response.status_code}: {response.text[:300]}"
                return result
            async for payload in sse_payloads(response):
                if "error" in payload:
                    result.error = str(payload["error"])[:300]
                    return result
                if payload.get("usage"):
                    _read_usage(result, payload["usage"])
                text = _chunk_text(payload)
                if not text:
                    continue
                now = time.perf_counter()
                if chunks_with_text == 0:
                    result.ttft = now - result.start
                else:
                    result.itl.append(now - last)
                last = now
                chunks_with_text += 1
                result.text += text
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.e2e = time.perf_counter() - result.start
    if not result.output_tokens:  # server sent no usage: one token per text chunk
        result.output_tokens = chunks_with_text
    result.success = True
    return result
