"""Each error case against the real server: its HTTP status, OpenAI-style body and message."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from server_harness import SMALL_API_KEY, ServerProcess, wait_idle

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")


def _post(server: ServerProcess, path: str, body: bytes | dict[str, Any], **headers: str) -> httpx.Response:
    kwargs: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
    return httpx.post(
        server.url + path, headers={"content-type": "application/json", **headers}, timeout=60, **kwargs
    )


def _assert_error(r: httpx.Response, status: int, *needles: str, param: str | None = None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and isinstance(err["type"], str) and err["type"]
    for needle in needles:
        assert needle.lower() in err["message"].lower(), err["message"]
    if param is not None:
        assert err["param"] == param


@pytest.mark.parametrize(
    ("body", "needles", "param"),
    [
        ({"prompt": "hi", "max_tokens": -1}, ["greater than or equal to 0"], "max_tokens"),
        (b'{"prompt": "hi", "temperature": NaN}', ["finite"], "temperature"),
        ({"prompt": "hi", "top_p": 0}, ["top_p must be in (0, 1]"], "top_p"),
        ({"prompt": "hi", "top_p": 1.5}, ["top_p must be in (0, 1]"], "top_p"),
        ({"prompt": "hi", "max_tokens": "ten"}, ["valid integer"], "max_tokens"),
        ({"prompt": "hi", "stream": "yes"}, ["valid boolean"], "stream"),
        ({"prompt": "hi", "n": 10**6}, ["less than or equal to 16"], "n"),
        ({"prompt": "hi", "logprobs": 50}, ["less than or equal to 20"], "logprobs"),
        ({"prompt": "hi", "presence_penalty": 3}, ["less than or equal to 2"], "presence_penalty"),
        ({"max_tokens": 3}, ["field required"], "prompt"),
        ({"prompt": [99999999]}, ["out of range"], "prompt"),
        ({"prompt": []}, ["must not be empty"], None),
        ({"prompt": "hi", "suffix": "the end"}, ["suffix"], "suffix"),
        ({"prompt": "hi", "best_of": 3}, ["best_of (3) other than n (1) is not supported"], None),
        (
            {"prompt": "hi", "logit_bias": {"49152": 1}},
            ["logit_bias token id 49152 is out of range"],
            "logit_bias",
        ),
        ({"prompt": "hi", "logit_bias": {"5": 101}}, ["biases in [-100, 100]"], "logit_bias"),
        ({"prompt": "hi", "logit_bias": {"five": 1}}, ["valid integer"], None),
        (
            {"prompt": "hi", "max_tokens": 2, "min_tokens": 3},
            ["less than or equal to max_tokens=2"],
            "min_tokens",
        ),
        (
            {"prompt": "hi", "guided_json": {"type": "object"}},
            ["structured output is not supported"],
            "guided_json",
        ),
        ({"prompt": "hi", "regex": "[a-z]+"}, ["structured output is not supported"], "regex"),
        ({"prompt": "hi", "use_beam_search": True}, ["beam search is not supported"], "use_beam_search"),
        ({"prompt": "hi", "lora_path": "adapter"}, ["loading lora adapters is not supported"], "lora_path"),
        ({"prompt": "hi", "return_hidden_states": True}, ["hidden states"], "return_hidden_states"),
        (
            {"prompt": "hi", "truncate_prompt_tokens": 0},
            ["greater than or equal to 1"],
            "truncate_prompt_tokens",
        ),
        (b'{"prompt": "hi",', ["malformed json"], None),
        (b"\xff\xfe{}", ["utf-8"], None),
        (b"[1, 2]", ["must be an object"], None),
    ],
)
def test_completion_rejections(
    smollm2_server: ServerProcess, body: Any, needles: list[str], param: str | None
) -> None:
    _assert_error(_post(smollm2_server, "/v1/completions", body), 400, *needles, param=param)


def test_prompt_longer_than_context(smollm2_server: ServerProcess) -> None:
    too_long = [100 + i % 1000 for i in range(9000)]  # context is 8192
    _assert_error(
        _post(smollm2_server, "/v1/completions", {"prompt": too_long}),
        400,
        "maximum context length is 8192",
        "9000 tokens",
        param="prompt",
    )
    fits_alone = [100] * 8000
    _assert_error(
        _post(smollm2_server, "/v1/completions", {"prompt": fits_alone, "max_tokens": 500}),
        400,
        "maximum context length is 8192",
        "8500 tokens",
        param="max_tokens",
    )


def test_chat_rejections(smollm2_server: ServerProcess) -> None:
    _assert_error(_post(smollm2_server, "/v1/chat/completions", {"messages": "hi"}), 400, "messages")
    _assert_error(_post(smollm2_server, "/v1/chat/completions", {"messages": []}), 400, "at least 1")
    bad_role = {"messages": [{"role": "wizard", "content": "hi"}]}
    _assert_error(_post(smollm2_server, "/v1/chat/completions", bad_role), 400, "role")
    nan_temp = b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
    _assert_error(_post(smollm2_server, "/v1/chat/completions", nan_temp), 400, "finite", param="temperature")
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    _assert_error(
        _post(smollm2_server, "/v1/chat/completions", image),
        400,
        "content parts of type 'image_url' are not supported",
        param="messages.0.content",
    )
    # known fields the server cannot honour are refused, not dropped
    hi = [{"role": "user", "content": "hi"}]
    json_mode = {"messages": hi, "response_format": {"type": "json_object"}}
    _assert_error(
        _post(smollm2_server, "/v1/chat/completions", json_mode), 400, "'json_object' is not supported"
    )
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    for body in ({"messages": hi, "tools": tools}, {"messages": hi, "tools": tools, "tool_choice": "auto"}):
        _assert_error(
            _post(smollm2_server, "/v1/chat/completions", body), 400, "tool calls are not supported"
        )
    plain = {"messages": hi, "max_tokens": 2, "tools": tools, "tool_choice": "none"}
    plain["response_format"] = {"type": "text"}
    plain["use_beam_search"] = False  # unset: the refused fields are only refused when asked for
    assert _post(smollm2_server, "/v1/chat/completions", plain).status_code == 200
    template = {"messages": hi, "chat_template": "{{ messages }}"}
    _assert_error(
        _post(smollm2_server, "/v1/chat/completions", template), 400, "--chat-template", param="chat_template"
    )
    both_open = {"messages": hi, "continue_final_message": True}  # add_generation_prompt defaults to true
    _assert_error(_post(smollm2_server, "/v1/chat/completions", both_open), 400, "cannot both be true")


def test_unknown_model_and_route(smollm2_server: ServerProcess) -> None:
    _assert_error(
        _post(smollm2_server, "/v1/completions", {"prompt": "hi", "model": "gpt-9"}),
        404,
        "gpt-9",
        param="model",
    )
    assert httpx.get(smollm2_server.url + "/v1/nothing").json()["error"]["code"] == 404
    _assert_error(httpx.get(smollm2_server.url + "/v1/completions"), 405)


def test_openai_client_sees_bad_request(smollm2_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=smollm2_server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="SmolLM2-135M-Instruct", prompt="hi", top_p=2.0)
    assert "top_p" in str(info.value)


def test_api_key(small_server: ServerProcess) -> None:
    body = {"prompt": "hi", "max_tokens": 1}
    _assert_error(_post(small_server, "/v1/completions", body), 401, "api key")
    _assert_error(_post(small_server, "/v1/completions", body, authorization="Bearer wrong"), 401, "api key")
    assert (
        _post(small_server, "/v1/completions", body, authorization=f"Bearer {SMALL_API_KEY}").status_code
        == 200
    )
    native = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
    _assert_error(_post(small_server, "/generate", native), 401, "api key")  # SGLang's route too
    assert (
        _post(small_server, "/generate", native, authorization=f"Bearer {SMALL_API_KEY}").status_code == 200
    )
    assert httpx.get(small_server.url + "/health").status_code == 200  # health stays open for routers
    client = openai.OpenAI(base_url=small_server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_queue_full_is_503_and_slots_come_back(small_server: ServerProcess) -> None:
    """2 running + 1 queued fill the small server; the 4th request gets 503 until they finish."""
    headers = {"Authorization": f"Bearer {SMALL_API_KEY}"}
    long_body = {"prompt": "Tell me a long story.", "max_tokens": 200, "stream": True, "ignore_eos": True}

    async def scenario() -> tuple[int, str, int]:
        async with httpx.AsyncClient(base_url=small_server.url, headers=headers, timeout=60) as client:
            streams = [client.stream("POST", "/v1/completions", json=long_body) for _ in range(3)]
            responses = [await s.__aenter__() for s in streams]
            assert [r.status_code for r in responses] == [200, 200, 200]
            rejected = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
            for s in streams:  # disconnect: the server must abort all three at once
                await s.__aexit__(None, None, None)
            await asyncio.sleep(1.0)
            accepted = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
            return rejected.status_code, rejected.text, accepted.status_code

    status, text, after = asyncio.run(scenario())
    assert status == 503 and "overloaded" in text and '"code":503' in text.replace(" ", "")
    assert after == 200
    stats = wait_idle(small_server, timeout=10)
    assert stats["running"] == 0 and stats["used_tokens"] == 0
