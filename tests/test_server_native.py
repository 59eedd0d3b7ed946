"""SGLang's native ``POST /generate`` on the real SmolLM2 server: single and batch prompts, ``n``, the
``meta_info`` finish reasons and logprobs, streaming, and its 400s."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest
from server_harness import ServerProcess

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is"
GREEDY = {"max_new_tokens": 6, "temperature": 0}


def _generate(server: ServerProcess, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + "/generate", json=body, timeout=120)


def _ok(server: ServerProcess, body: dict[str, Any]) -> Any:
    r = _generate(server, body)
    assert r.status_code == 200, r.text
    return r.json()


def test_single_prompt_matches_completions(smollm2_server: ServerProcess) -> None:
    out = _ok(smollm2_server, {"text": PROMPT, "sampling_params": GREEDY})
    ref = httpx.post(
        smollm2_server.url + "/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0},
        timeout=120,
    ).json()["choices"][0]["text"]
    assert out["text"] == ref and len(out["output_ids"]) == 6
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == 5 and meta["completion_tokens"] == 6 and meta["e2e_latency"] > 0
    ids = _ok(smollm2_server, {"input_ids": [504, 3458, 282], "sampling_params": GREEDY, "rid": "mine"})
    assert ids["meta_info"]["prompt_tokens"] == 3 and len(ids["output_ids"]) == 6
    assert ids["meta_info"]["id"] == "mine"  # the client's request id, as SGLang's rid


def test_batch_n_and_per_prompt_params(smollm2_server: ServerProcess) -> None:
    body = {"text": [PROMPT, "1, 2, 3,"], "sampling_params": [{**GREEDY, "n": 2}, {**GREEDY, "n": 2}]}
    out = _ok(smollm2_server, body)
    assert len(out) == 4 and out[0]["text"] == out[1]["text"] and out[2]["text"] == out[3]["text"]
    assert len({o["meta_info"]["id"] for o in out}) == 4
    one = _ok(smollm2_server, {"text": [PROMPT], "sampling_params": GREEDY})
    assert isinstance(one, list) and one[0]["text"] == out[0]["text"]  # a batch of one is still a list


def test_finish_reasons_name_what_matched(smollm2_server: ServerProcess) -> None:
    full = _ok(smollm2_server, {"text": PROMPT, "sampling_params": GREEDY})["text"]
    stop = full[1:4]
    cut = _ok(smollm2_server, {"text": PROMPT, "sampling_params": {**GREEDY, "stop": [stop]}})
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop} and stop not in cut["text"]
    kept = _ok(
        smollm2_server, {"text": PROMPT, "sampling_params": {**GREEDY, "stop": [stop], "no_stop_trim": True}}
    )
    assert kept["text"] == cut["text"] + stop and kept["meta_info"]["finish_reason"]["matched"] == stop
    chat = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    eos = _ok(smollm2_server, {"text": chat, "sampling_params": {"max_new_tokens": 40, "temperature": 0}})
    assert eos["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}  # <|im_end|>, SmolLM2's EOS
    assert eos["output_ids"][-1] == 2 and eos["text"].endswith("Paris.")
    held = {"max_new_tokens": 40, "temperature": 0, "min_new_tokens": len(eos["output_ids"]) + 3}
    longer = _ok(smollm2_server, {"text": chat, "sampling_params": held})
    assert len(longer["output_ids"]) >= len(eos["output_ids"]) + 3


def test_logprobs(smollm2_server: ServerProcess) -> None:
    body = {
        "text": PROMPT,
        "sampling_params": GREEDY,
        "return_logprob": True,
        "top_logprobs_num": 2,
        "logprob_start_len": 1,
    }
    meta = _ok(smollm2_server, body)["meta_info"]
    out_lp, top = meta["output_token_logprobs"], meta["output_top_logprobs"]
    assert len(out_lp) == 6 and all(len(t) == 2 for t in top)
    assert all(lp[1] == t[0][1] and lp[0] == pytest.approx(t[0][0]) for lp, t in zip(out_lp, top))  # greedy
    assert len(meta["input_token_logprobs"]) == 4 and all(
        e[0] is not None for e in meta["input_token_logprobs"]
    )
    ref = httpx.post(
        smollm2_server.url + "/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 0},
        timeout=120,
    ).json()["choices"][0]["logprobs"]["token_logprobs"]
    assert [e[0] for e in out_lp] == pytest.approx(ref, abs=1e-4)
    named = _ok(smollm2_server, {**body, "return_text_in_logprobs": True})["meta_info"]
    pieces = [e[2] for e in named["output_token_logprobs"]]
    assert "".join(pieces) == _ok(smollm2_server, {"text": PROMPT, "sampling_params": GREEDY})["text"]
    assert [e[:2] for e in named["output_token_logprobs"]] == [e[:2] for e in out_lp]
    assert all(isinstance(t[2], str) for pos in named["output_top_logprobs"] for t in pos)
    assert all(isinstance(e[2], str) for e in named["input_token_logprobs"])
    assert all(e[2] is None for e in out_lp)  # without it, SGLang's None


def test_streaming_sends_the_text_so_far(smollm2_server: ServerProcess) -> None:
    whole = _ok(smollm2_server, {"text": PROMPT, "sampling_params": GREEDY})
    events: list[str] = []
    body = {"text": PROMPT, "sampling_params": GREEDY, "stream": True}
    with httpx.stream("POST", smollm2_server.url + "/generate", json=body, timeout=120) as r:
        assert r.status_code == 200
        events = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])) and texts[-1] == whole["text"]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"sampling_params": GREEDY}, "exactly one of text and input_ids"),
        ({"text": "a", "input_ids": [1]}, "exactly one of text and input_ids"),
        ({"text": "a", "sampling_params": {"max_new_tokens": 2, "regex": "a+"}}, "(regex) is not supported"),
        ({"text": "a", "sampling_params": {"max_tokens": 2}}, "sampling_params.max_tokens: extra inputs"),
        ({"text": "a", "image_data": "cat.png"}, "image_data: input other than text or token ids is not"),
        ({"text": "a", "lora_path": "adapter"}, "lora_path: loading lora adapters is not supported"),
        ({"input_embeds": [[0.1]]}, "input_embeds: input other than text"),
        ({"text": "a", "return_hidden_states": True}, "returning hidden states"),
        ({"text": "a", "session_params": {"id": "s"}}, "continuing sessions"),
        ({"text": "a", "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
        (
            {"text": "a", "sampling_params": {"max_new_tokens": 2, "min_new_tokens": 3}},
            "min_new_tokens must be",
        ),
        ({"text": ["a", "b"], "sampling_params": [GREEDY]}, "2 prompts but 1 sampling_params"),
        ({"input_ids": [99999999]}, "out of range"),
        ({"text": ["a", "b"], "rid": ["one"]}, "1 rids for 2 outputs"),
        ({"text": "a", "sampling_params": {"logit_bias": {"49152": 1}}}, "logit_bias token id 49152"),
        ({"text": "a", "sampling_params": {"max_new_tokens": 10**6}}, "maximum context length"),
    ],
)
def test_rejections(smollm2_server: ServerProcess, body: dict[str, Any], needle: str) -> None:
    r = _generate(smollm2_server, body)
    assert r.status_code == 400, r.text
    assert needle.lower() in r.json()["error"]["message"].lower()


def test_tokenize_detokenize_and_version(smollm2_server: ServerProcess) -> None:
    url = smollm2_server.url
    out = httpx.post(url + "/tokenize", json={"prompt": PROMPT}, timeout=60).json()
    assert out["count"] == len(out["tokens"]) == 5 and out["max_model_len"] == 8192
    back = httpx.post(url + "/detokenize", json={"tokens": out["tokens"]}, timeout=60).json()
    assert back == {"prompt": PROMPT}
    chat = httpx.post(
        url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=60
    ).json()
    served = httpx.post(
        url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
        timeout=60,
    ).json()
    assert chat["count"] == served["usage"]["prompt_tokens"]  # the chat route's own template and ids
    both = httpx.post(url + "/tokenize", json={"prompt": "a", "messages": [{"role": "user", "content": "b"}]})
    assert (
        both.status_code == 400
        and both.json()["error"]["message"] == "give exactly one of prompt and messages"
    )
    bad = httpx.post(url + "/detokenize", json={"tokens": [49152]}, timeout=60)
    assert bad.status_code == 400 and "out of range" in bad.json()["error"]["message"]
    assert httpx.get(url + "/version", timeout=60).json()["version"]


def test_abort_request_ends_a_running_output(smollm2_server: ServerProcess) -> None:
    url = smollm2_server.url
    long = {"max_new_tokens": 4000, "ignore_eos": True, "temperature": 0}
    results: dict[str, Any] = {}

    def run(rid: str) -> None:
        results[rid] = _ok(smollm2_server, {"text": PROMPT, "sampling_params": long, "rid": rid})

    threads = [threading.Thread(target=run, args=(rid,)) for rid in ("keep-a", "stop-b")]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while smollm2_server.engine_stats()["running"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    r = httpx.post(url + "/abort_request", json={"rid": "stop-b"}, timeout=60)
    assert r.status_code == 200
    threads[1].join(timeout=60)
    stopped = results["stop-b"]["meta_info"]
    assert stopped["finish_reason"] == {"type": "abort"} and stopped["completion_tokens"] < 4000
    assert threads[0].is_alive()  # the other output runs on
    assert httpx.post(url + "/abort_request", json={"abort_all": True}, timeout=60).status_code == 200
    threads[0].join(timeout=60)
    assert results["keep-a"]["meta_info"]["finish_reason"] == {"type": "abort"}
    assert httpx.post(url + "/abort_request", json={"rid": "gone"}, timeout=60).status_code == 200
