"""The real SmolLM2 server through the official ``openai`` client and raw HTTP: completions, chat,
streaming, info endpoints, metrics, and the request shape lm-eval's ``local-completions`` sends."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_harness import ServerProcess, wait_idle

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def client(smollm2_server: ServerProcess) -> Any:
    return openai.OpenAI(base_url=smollm2_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_completion_string_prompt(client: Any) -> None:
    out = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0
    )
    assert out.object == "text_completion" and out.model == MODEL
    assert len(out.choices) == 1 and out.choices[0].finish_reason == "length" and out.choices[0].text
    assert out.usage.prompt_tokens > 0 and out.usage.completion_tokens == 6
    assert out.usage.total_tokens == out.usage.prompt_tokens + 6
    assert out.usage.prompt_tokens_details.cached_tokens >= 0


def test_completion_batch_token_ids_and_n(client: Any) -> None:
    out = client.completions.create(
        model=MODEL, prompt=["Once upon a time", "Hello"], max_tokens=3, n=2, temperature=0
    )
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    by_index = {c.index: c.text for c in out.choices}
    assert by_index[0] == by_index[1] and by_index[2] == by_index[3]  # greedy: n copies agree
    ids = client.completions.create(model=MODEL, prompt=[504, 3458, 282], max_tokens=2, temperature=0)
    assert ids.usage.prompt_tokens == 3 and ids.usage.completion_tokens == 2


def test_stop_sequence_cuts_text(client: Any) -> None:
    full = (
        client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=8, temperature=0)
        .choices[0]
        .text
    )
    stop = full.strip()[:2]
    cut = client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=8, temperature=0, stop=[stop]
    )
    assert cut.choices[0].finish_reason == "stop" and stop not in cut.choices[0].text
    kept = client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=8, temperature=0, stop=[stop],
        extra_body={"include_stop_str_in_output": True},
    )  # fmt: skip
    assert kept.choices[0].text == cut.choices[0].text + stop


def test_seeded_choices_differ_and_repeat(client: Any) -> None:
    def texts() -> list[str]:
        out = client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=8, n=3, seed=42, temperature=1.0
        )
        return [c.text for c in sorted(out.choices, key=lambda c: c.index)]

    first = texts()
    assert len(set(first)) == 3 and texts() == first  # n seeded choices: distinct, and reproducible
    one = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=8, seed=42, temperature=1.0
    )
    assert one.choices[0].text == first[0]  # choice 0 keeps the request's own seed


def test_logit_bias_and_min_tokens(client: Any) -> None:
    out = client.completions.create(
        model=MODEL,
        prompt="The capital of France is",
        max_tokens=3,
        temperature=0,
        logprobs=0,
        logit_bias={"28": 100},
    )
    forced = out.choices[0].logprobs.tokens
    assert len(forced) == 3 and len(set(forced)) == 1 and out.choices[0].text == forced[0] * 3
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=40,
        temperature=0,
    )
    n = chat.usage.completion_tokens
    assert chat.choices[0].finish_reason == "stop" and n < 30  # ends by EOS ...
    held = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=40,
        temperature=0,
        extra_body={"min_tokens": n + 5},
    )
    assert held.usage.completion_tokens >= n + 5  # ... but not before min_tokens


def test_chat_uses_the_template(client: Any) -> None:
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
        max_tokens=8,
        temperature=0,
    )
    assert out.object == "chat.completion" and out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content
    # SmolLM2's template wraps each message in <|im_start|>role ... <|im_end|> and adds the assistant header.
    assert out.usage.prompt_tokens > 15


def test_streaming_matches_non_streaming(client: Any) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "max_tokens": 8, "temperature": 0}
    whole = client.completions.create(prompt="The sky is", **kwargs).choices[0].text
    chunks = list(
        client.completions.create(
            prompt="The sky is", stream=True, stream_options={"include_usage": True}, **kwargs
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    msgs = [{"role": "user", "content": "Name a color."}]
    chat_whole = client.chat.completions.create(messages=msgs, **kwargs).choices[0].message.content
    chat_chunks = list(client.chat.completions.create(messages=msgs, stream=True, **kwargs))
    assert chat_chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chat_chunks if c.choices) == chat_whole
    assert chat_chunks[-1].choices[0].finish_reason == "length"


def test_raw_sse_ends_with_done(smollm2_server: ServerProcess) -> None:
    body = {"prompt": "Hi", "max_tokens": 2, "stream": True}
    with httpx.stream("POST", smollm2_server.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)


def test_info_endpoints(smollm2_server: ServerProcess) -> None:
    url = smollm2_server.url
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/health_generate", timeout=30).status_code == 200  # a real one-token forward
    models = httpx.get(url + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == MODEL
    info = httpx.get(url + "/get_model_info").json()
    assert info["model_path"].endswith(".gguf") and info["is_generation"] and info["vocab_size"] == 49152
    server = httpx.get(url + "/get_server_info").json()
    assert server["max_running_requests"] == 32 and server["max_total_num_tokens"] >= 16384
    assert server["port"] == smollm2_server.port and "api_key" not in server


def _metric(text: str, name: str) -> float:
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " ")]
    assert values, f"{name} missing from /metrics"
    return values[0]


def test_metrics_count_tokens_and_latency(client: Any, smollm2_server: ServerProcess) -> None:
    before = httpx.get(smollm2_server.url + "/metrics").text
    client.completions.create(model=MODEL, prompt="Count: one two", max_tokens=4, temperature=0)
    wait_idle(smollm2_server)
    after = httpx.get(smollm2_server.url + "/metrics").text
    assert (
        _metric(after, "nibblekv:generation_tokens_total")
        - _metric(before, "nibblekv:generation_tokens_total")
        == 4
    )
    assert _metric(after, "nibblekv:prompt_tokens_total") > _metric(before, "nibblekv:prompt_tokens_total")
    for name in ("nibblekv:time_to_first_token_seconds_count", "nibblekv:inter_token_latency_seconds_count"):
        assert _metric(after, name) > _metric(before, name)
    assert _metric(after, "nibblekv:max_total_num_tokens") >= 16384
    for gauge in ("num_running_reqs", "num_queue_reqs", "token_usage", "cache_hit_rate"):
        assert _metric(after, f"nibblekv:{gauge}") >= 0


# ---- lm-eval's local-completions, loglikelihood requests ---------------------------------------------


def _lm_eval_parse(out: dict[str, Any], ctxlens: list[int]) -> list[tuple[float, bool]]:
    """lm-eval's ``LocalCompletionsAPI.parse_logprobs`` (lm_eval/models/openai_completions.py)."""
    res = []
    for choice, ctxlen in zip(sorted(out["choices"], key=lambda c: c["index"]), ctxlens, strict=True):
        lp = choice["logprobs"]
        continuation = lp["token_logprobs"][ctxlen:-1]
        is_greedy = all(
            tok == max(top.values()) for tok, top in zip(continuation, lp["top_logprobs"][ctxlen:-1])
        )
        res.append((sum(continuation), is_greedy))
    return res


@pytest.fixture(scope="module")
def tokenizer(smollm2_path: Path) -> Any:
    """The bundled model's tokenizer alone (cached by the server's first start, so quick)."""
    from nibblekv.model.tokenizer import HFTokenizer

    return HFTokenizer.from_gguf(smollm2_path, None)


def test_lm_eval_loglikelihood_request_shape(smollm2_server: ServerProcess, tokenizer: Any) -> None:
    """The exact payload lm-eval sends (token-id batch, echo, logprobs=1, max_tokens=1) scores right.

    Reference: the logprob the decode path reports for the first generated token must equal the
    one the prompt-scoring (prefill) path reports for the same token at the same position.
    """
    url = smollm2_server.url + "/v1/completions"
    context = tokenizer.encode("The capital of France is")
    greedy = httpx.post(
        url, json={"prompt": context, "max_tokens": 1, "temperature": 0, "logprobs": 5}, timeout=60
    )
    first = greedy.json()["choices"][0]["logprobs"]
    best_text, best_lp = first["tokens"][0], first["token_logprobs"][0]
    assert best_text == " Paris"
    pairs = [
        (context, tokenizer.encode(" Paris", add_special_tokens=False)),
        (context, tokenizer.encode(" a banana split", add_special_tokens=False)),
    ]
    payload = {  # lm_eval.models.openai_completions.LocalCompletionsAPI._create_payload(generate=False)
        "model": MODEL,
        "prompt": [c + k for c, k in pairs],
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    out = httpx.post(url, json=payload, timeout=120).json()
    for choice, (c, k) in zip(sorted(out["choices"], key=lambda ch: ch["index"]), pairs, strict=True):
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(c) + len(k) + 1  # prompt + 1 generated
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert lp["tokens"][: len(c)] == [tokenizer.decode([t], skip_special_tokens=False) for t in c]
    (paris_ll, paris_greedy), (banana_ll, banana_greedy) = _lm_eval_parse(out, [len(c) for c, _ in pairs])
    assert math.isclose(paris_ll, best_lp, abs_tol=1e-3), (paris_ll, best_lp)
    assert paris_greedy and not banana_greedy
    assert banana_ll < paris_ll - 5


def test_echo_with_zero_max_tokens(smollm2_server: ServerProcess) -> None:
    payload = {"prompt": "Hello world, how are", "max_tokens": 0, "echo": True, "logprobs": 0}
    out = httpx.post(smollm2_server.url + "/v1/completions", json=payload, timeout=60).json()
    choice = out["choices"][0]
    assert choice["text"] == "Hello world, how are" and out["usage"]["completion_tokens"] == 0
    assert len(choice["logprobs"]["tokens"]) == out["usage"]["prompt_tokens"]
    assert all(isinstance(x, float) for x in choice["logprobs"]["token_logprobs"][1:])
    assert json.dumps(out)  # plain JSON, no NaN


def test_vllm_prompt_and_template_extensions(smollm2_server: ServerProcess) -> None:
    url = smollm2_server.url

    def post(path: str, body: dict[str, Any]) -> Any:
        r = httpx.post(url + path, json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    greedy = {"max_tokens": 4, "temperature": 0}
    ids = post("/tokenize", {"prompt": "The capital of France is"})["tokens"]
    cut = post(
        "/v1/completions", {"prompt": "The capital of France is", "truncate_prompt_tokens": 2, **greedy}
    )
    tail = post("/v1/completions", {"prompt": ids[-2:], **greedy})
    assert cut["usage"]["prompt_tokens"] == 2 and cut["choices"][0]["text"] == tail["choices"][0]["text"]
    # a special token the model is pushed to write: kept in the text only with skip_special_tokens false
    forced = {"prompt": "hi", "max_tokens": 2, "ignore_eos": True, "logit_bias": {"1": 100}}
    assert post("/v1/completions", forced)["choices"][0]["text"] == ""
    kept = post(
        "/v1/completions", {**forced, "skip_special_tokens": False, "spaces_between_special_tokens": True}
    )
    assert kept["choices"][0]["text"] == "<|im_start|><|im_start|>"
    # an open final assistant turn: the model continues it, the prompt ends with its text
    turn = [{"role": "user", "content": "What is the capital of France?"}]
    turn.append({"role": "assistant", "content": "The capital of France is"})
    how = {"add_generation_prompt": False, "continue_final_message": True, "chat_template_kwargs": {"x": 1}}
    rendered = post("/tokenize", {"messages": turn, **how})
    text = post("/detokenize", {"tokens": rendered["tokens"]})["prompt"]
    assert text.endswith("<|im_start|>assistant\nThe capital of France is")
    chat = post("/v1/chat/completions", {"messages": turn, **how, **greedy})
    assert chat["usage"]["prompt_tokens"] == rendered["count"]
    assert chat["choices"][0]["message"]["content"].strip().startswith("Paris")
