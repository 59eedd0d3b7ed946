"""Sampler math and SamplingParams validation (no model needed)."""

from __future__ import annotations

import math

import pytest
import torch

from nibblekv.engine.request import Request
from nibblekv.engine.sampler import Sampler, apply_penalties, filter_logits
from nibblekv.engine.sampling_params import SamplingParams


def _req(params: SamplingParams, tokens: list[int] | None = None, prompt_len: int | None = None) -> Request:
    tokens = tokens or [0]
    return Request(
        "r", list(tokens), params, params.max_new_tokens, num_prompt_tokens=prompt_len or len(tokens)
    )


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 2.0}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"frequency_penalty": 3.0}, "frequency_penalty"),
        ({"presence_penalty": float("inf")}, "presence_penalty"),
        ({"stop": [""]}, "stop"),
        ({"logprobs": 50}, "logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"seed": 1.5}, "seed"),
        ({"min_new_tokens": -1}, "min_new_tokens"),
        ({"max_new_tokens": 4, "min_new_tokens": 5}, "min_new_tokens"),
        ({"logit_bias": {3: 100.5}}, "logit_bias"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {"three": 1.0}}, "logit_bias"),
        ({"logit_bias": {3: float("nan")}}, "logit_bias"),
    ],
)
def test_invalid_params_raise_clear_errors(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"invalid sampling parameter: {field}"):
        SamplingParams(**kwargs)


def test_params_normalize_stop() -> None:
    p = SamplingParams(stop="###", stop_token_ids=[5])
    assert p.stop == ("###",) and p.stop_token_ids == (5,)


def test_filters_top_k_top_p_min_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 3))
    params = [SamplingParams(top_k=2), SamplingParams(top_p=0.8), SamplingParams(min_p=0.25)]
    kept = torch.isfinite(filter_logits(logits, params))
    assert kept.tolist() == [
        [True, True, False, False],  # top-2
        [True, True, False, False],  # 0.5 + 0.3 reaches 0.8: the rest is dropped
        [True, True, True, False],  # >= 0.25 * 0.5
    ]
    one = filter_logits(logits[:1], [SamplingParams(top_p=0.1)])
    assert torch.isfinite(one).sum() == 1  # the best token always survives


def test_unfiltered_rows_skip_the_sort_and_match_the_filtered_path() -> None:
    # no top-k/top-p/min-p anywhere: the fast path (no sort) equals the general path with neutral filters
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    params = [SamplingParams(temperature=t) for t in (0.7, 1.0, 1.3)]
    fast = filter_logits(logits, params)
    slow = filter_logits(torch.cat([logits, logits[:1]]), params + [SamplingParams(top_k=10)])  # forces the sort
    assert torch.allclose(fast, slow[:3]) and torch.isfinite(fast).all()
    assert torch.isfinite(filter_logits(logits, [SamplingParams(top_k=50)] * 3)).all()  # k = vocab keeps all


def test_temperature_scales_logits() -> None:
    logits = torch.tensor([[2.0, 1.0]])
    out = filter_logits(logits, [SamplingParams(temperature=0.5)])
    assert torch.allclose(out, logits / 0.5)


def test_penalties() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, 1.0]])
    rep = _req(SamplingParams(repetition_penalty=2.0), tokens=[0, 1], prompt_len=2)
    assert apply_penalties(logits, [rep]).tolist() == [[1.0, -4.0, 1.0, 1.0]]
    # output tokens [2, 2, 3]: frequency 0.5 * count, presence 1.0 once
    fp = _req(SamplingParams(frequency_penalty=0.5, presence_penalty=1.0), tokens=[0, 2, 2, 3], prompt_len=1)
    assert apply_penalties(logits, [fp]).tolist() == [[2.0, -2.0, -1.0, -0.5]]
    plain = _req(SamplingParams())
    assert apply_penalties(logits, [plain]) is logits


def test_greedy_and_logprobs() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 0.0]])
    reqs = [_req(SamplingParams(temperature=0, logprobs=2)), _req(SamplingParams(temperature=0))]
    res = Sampler(torch.device("cpu"))(logits, reqs)
    assert res.token_ids == [1, 0]
    lp = res.logprobs[0]
    ref = torch.log_softmax(logits[0], -1)
    assert lp is not None and lp.token_id == 1 and math.isclose(lp.logprob, float(ref[1]), rel_tol=1e-6)
    assert [t for t, _ in lp.top_logprobs] == [1, 3]
    assert res.logprobs[1] is None


def test_seeded_sampling_is_reproducible_and_batch_independent() -> None:
    torch.manual_seed(0)
    logits = torch.randn(1, 50)
    params = SamplingParams(temperature=1.0, seed=1234)

    def draw(batch_extra: int, sampler_seed: int) -> list[int]:
        sampler = Sampler(torch.device("cpu"), seed=sampler_seed)
        req = _req(params)
        others = [_req(SamplingParams(temperature=1.0)) for _ in range(batch_extra)]
        rows = torch.cat([logits] + [torch.randn(1, 50) for _ in others])
        return [sampler(rows, [req, *others]).token_ids[0] for _ in range(20)]

    assert draw(0, 0) == draw(3, 7)  # same request seed: same tokens whatever the batch and engine seed


def test_sampling_follows_the_distribution() -> None:
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log()[None].repeat(4000, 1)
    reqs = [_req(SamplingParams(temperature=1.0)) for _ in range(4000)]
    toks = torch.tensor(Sampler(torch.device("cpu"), seed=3)(logits, reqs).token_ids)
    freq = torch.bincount(toks, minlength=3).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03)
    reqs = [_req(SamplingParams(temperature=1.0, top_k=1)) for _ in range(10)]
    assert Sampler(torch.device("cpu"))(logits[:10], reqs).token_ids == [0] * 10


def test_logit_bias_moves_greedy_and_sampled_rows_and_leaves_logprobs_raw() -> None:
    p = SamplingParams(logit_bias={"7": 3})  # JSON's string keys, as the API sends them
    assert p.logit_bias == ((7, 3.0),) and hash(p)
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]] * 3)
    reqs = [
        _req(SamplingParams(temperature=0, logit_bias={2: 2.5}, logprobs=1)),  # 1 + 2.5 beats 3
        _req(SamplingParams(temperature=0, logit_bias={1: -100})),  # the best token banned: 3 next
        _req(SamplingParams(temperature=0)),  # no bias: untouched by the others'
    ]
    res = Sampler(torch.device("cpu"))(logits, reqs)
    assert res.token_ids == [2, 3, 1]
    lp = res.logprobs[0]
    raw = float(torch.log_softmax(logits[0], -1)[2])
    assert lp is not None and math.isclose(lp.logprob, raw, rel_tol=1e-6)
    sampled = [_req(SamplingParams(temperature=1.0, logit_bias={0: 100})) for _ in range(50)]
    assert Sampler(torch.device("cpu"), seed=1)(logits[:1].repeat(50, 1), sampled).token_ids == [0] * 50


def test_min_new_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    logits = torch.tensor([[0.0, 5.0, 4.0, 1.0]])  # 1 (EOS) is best, then 2 (a stop id)
    sampler = Sampler(torch.device("cpu"), eos_token_ids=[1])
    params = SamplingParams(temperature=0, min_new_tokens=2, stop_token_ids=[2])
    assert sampler(logits, [_req(params, [0, 3], prompt_len=1)]).token_ids == [3]  # 1 output < 2: masked
    # prompt tokens don't count
    assert sampler(logits, [_req(params, [0, 3, 3], prompt_len=2)]).token_ids == [3]
    assert sampler(logits, [_req(params, [0, 3, 3], prompt_len=1)]).token_ids == [1]  # 2 outputs: EOS allowed
    keep_eos = SamplingParams(temperature=0, min_new_tokens=2, ignore_eos=True, stop_token_ids=[2])
    assert sampler(logits, [_req(keep_eos, [0], prompt_len=1)]).token_ids == [1]  # EOS not a stop: not masked
