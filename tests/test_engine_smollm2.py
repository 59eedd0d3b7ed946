"""The engine end to end on the bundled SmolLM2 (fp32 on CPU, loaded once per session).

Every engine built here goes through ``make_engine``, whose teardown checks that every page of
both pools is free again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from nibblekv import Engine, SamplingParams
from nibblekv.cache.manager import main_len_after
from nibblekv.eval.data import DEFAULT_DATA_DIR
from nibblekv.model import CausalLM, Tokenizer

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
]
AUSTEN = DEFAULT_DATA_DIR / "pride_and_prejudice.txt"  # the packaged excerpt
GREEDY = SamplingParams(temperature=0, max_new_tokens=32, ignore_eos=True)


@pytest.fixture
def make_engine(smollm2: tuple[CausalLM, Tokenizer]) -> Iterator[Callable[..., Engine]]:
    engines: list[Engine] = []

    def make(**kw: object) -> Engine:
        kw.setdefault("max_total_tokens", 4096)
        kw.setdefault("decode_log_interval", 0)
        engines.append(Engine(loaded=smollm2, **kw))
        return engines[-1]

    yield make
    for e in engines:
        assert not e.has_unfinished() and e.pool.all_free(), "pages leaked"


def _chat(tok: Tokenizer, text: str) -> list[int]:
    return tok.apply_chat_template([{"role": "user", "content": text}])


def _passage(tok: Tokenizer, n: int) -> list[int]:
    text = AUSTEN.read_text(encoding="utf-8")
    start = text.index("It is a truth universally acknowledged")
    return tok.encode(text[start : start + 8 * n])[:n]


@pytest.fixture(scope="module")
def hf_model(smollm2_path: Path):  # -> transformers LlamaForCausalLM, fp32
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(smollm2_path.parent), gguf_file=smollm2_path.name, dtype=torch.float32
    )
    return model.eval()


@torch.no_grad()
def _hf_greedy(hf, prompt: list[int], steps: int) -> list[int]:
    out: list[int] = []
    res = hf(torch.tensor([prompt]), use_cache=True)
    for _ in range(steps):
        out.append(int(res.logits[0, -1].argmax()))
        res = hf(torch.tensor([[out[-1]]]), past_key_values=res.past_key_values, use_cache=True)
    return out


def test_greedy_auto_kv_equals_transformers(make_engine, smollm2, hf_model) -> None:
    tok = smollm2[1]
    engine = make_engine(
        kv_cache_dtype="auto", chunked_prefill_size=16
    )  # small chunks: extend over cache too
    prompts = [_chat(tok, p) for p in PROMPTS]
    outs = engine.generate(prompts, GREEDY)  # all three batched together
    assert engine.pool.spec.kv_dtype.value == "fp32"
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == _hf_greedy(hf_model, prompt, 32), out.text
    assert "Paris" in outs[0].text


def test_chunked_prefill_equals_unchunked_bf16(make_engine, smollm2) -> None:
    prompt = _passage(smollm2[1], 300)
    params = SamplingParams(temperature=0, max_new_tokens=16, ignore_eos=True)
    whole = make_engine(kv_cache_dtype="bf16", chunked_prefill_size=0).generate([prompt], params)[0]
    chunked = make_engine(kv_cache_dtype="bf16", chunked_prefill_size=64).generate([prompt], params)[0]
    assert chunked.token_ids == whole.token_ids


def _teacher_forced_top1(engine: Engine, prompt: list[int]) -> list[int]:
    out = engine.generate([prompt], SamplingParams(max_new_tokens=0, prompt_logprobs=1))[0]
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(prompt) - 1
    return [lp.top_logprobs[0][0] for lp in out.prompt_logprobs]


@pytest.fixture(scope="module")
def austen_bf16_top1(smollm2) -> tuple[list[int], list[int]]:
    """(512-token Austen passage, its teacher-forced top-1 with bf16 KV), shared by the nvfp4 cases."""
    prompt = _passage(smollm2[1], 512)
    engine = Engine(loaded=smollm2, kv_cache_dtype="bf16", chunked_prefill_size=32, max_total_tokens=4096)
    top1 = _teacher_forced_top1(engine, prompt)
    assert engine.pool.all_free()
    return prompt, top1


@pytest.mark.parametrize("window", [0, 64])
def test_nvfp4_teacher_forced_agreement_with_bf16(make_engine, austen_bf16_top1, window: int) -> None:
    """512 tokens of Austen, prefilled in 32-token chunks so every chunk attends through the cache."""
    prompt, ref = austen_bf16_top1
    assert len(prompt) == 512
    nv = make_engine(kv_cache_dtype="nvfp4", chunked_prefill_size=32, kv_recent_window=window)
    got = _teacher_forced_top1(nv, prompt)
    agreement = sum(a == b for a, b in zip(ref, got)) / len(ref)
    print(f"nvfp4 (W={window}) teacher-forced top-1 agreement with bf16: {agreement:.3f}")
    assert agreement >= 0.90


def test_nvfp4_decode_path_matches_extend_path(make_engine, smollm2) -> None:
    """Decode (demote, write, attend) and 1-token extends (attend, demote, write) read the same cache,
    except on the steps that demote a page: there the extend still sees that page in bf16."""
    prompt = smollm2[1].encode("Once upon a time, in a small village by the sea,")
    # NOTE: rotation off: q/k/v @ H over 1 row (decode) vs a chunk (extend) may round differently,
    # which would test matmul shape-invariance, not the two paths' cache reads.
    engine = make_engine(
        kv_cache_dtype="nvfp4",
        kv_recent_window=16,
        chunked_prefill_size=1,
        kv_hadamard=False,
        kv_prefill_window=0,  # the window rule alone (the one-token chunks below are prefill chunks)
    )
    gen = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=36, ignore_eos=True))[0]
    assert len(prompt) + 36 > 16 + 2 * 16  # long enough for tail pages to be demoted twice
    assert engine.pool.spec.recent_window == 16
    top1 = _teacher_forced_top1(engine, prompt + gen.token_ids)
    # the step growing to L + 1 tokens predicts token L + 1; it demotes iff Lq grows
    lq, demoting = 0, set()
    for n in range(1, len(prompt) + len(gen.token_ids)):
        new_lq = main_len_after(lq, n, 16, 16)
        if new_lq > lq:
            demoting.add(n)
        lq = new_lq
    positions = [i for i in range(len(prompt) - 1, len(top1)) if i + 1 not in demoting]
    assert len(positions) >= len(gen.token_ids) - 3
    assert [top1[i] for i in positions] == [gen.token_ids[i - len(prompt) + 1] for i in positions]


def test_tail_only_request_equals_unquantized(make_engine, smollm2) -> None:
    """A request shorter than the window lives in the (fp32) tail: same tokens as fp32 KV."""
    prompt = smollm2[1].encode("The three primary colors are")
    params = SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True)
    ref = make_engine(kv_cache_dtype="auto").generate([prompt], params)[0]
    got = make_engine(kv_cache_dtype="nvfp4", kv_recent_window=64).generate([prompt], params)[0]
    assert len(prompt) + 20 < 64 and got.token_ids == ref.token_ids


def test_prefill_window_reads_earlier_chunks_unquantized(make_engine, smollm2) -> None:
    """With a prefill window covering the prompt, every chunk of an nvfp4 chunked prefill reads the
    earlier chunks from the (fp32) tail: its prompt logprobs are the unchunked prefill's, which attends
    to fresh K/V only. With the window off the quantized prefix shows; the default lies between."""
    prompt = _passage(smollm2[1], 300)
    params = SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True, prompt_logprobs=1)

    def run(**kw: object) -> tuple[torch.Tensor, list[int]]:
        out = make_engine(kv_cache_dtype="nvfp4", **kw).generate([prompt], params)[0]
        assert out.prompt_logprobs is not None
        return torch.tensor([lp.logprob for lp in out.prompt_logprobs]), out.token_ids

    whole, _ = run(chunked_prefill_size=0)
    covered, tokens = run(chunked_prefill_size=64, kv_prefill_window=320)
    off, _ = run(chunked_prefill_size=64, kv_prefill_window=0)
    default, _ = run(chunked_prefill_size=64)  # the previous chunk + W = 128 tokens in the tail
    assert len(tokens) == 4  # decoding after the last chunk's demotion works
    err = {
        name: float((x - whole).abs().max())
        for name, x in (("covered", covered), ("off", off), ("default", default))
    }
    assert err["covered"] < 1e-4, err
    assert err["off"] > 1e-2, err
    rms = {name: float((x - whole).pow(2).mean().sqrt()) for name, x in (("off", off), ("default", default))}
    assert rms["default"] < 0.7 * rms["off"], rms


def test_preemption_tiny_pool(make_engine, smollm2) -> None:
    tok = smollm2[1]
    prompts = [_chat(tok, p) for p in PROMPTS] + [tok.encode("Tell me a story about a dragon.")]
    params = SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True)
    ref = make_engine(max_total_tokens=2048).generate(prompts, params)
    # NOTE: without the radix cache: shared chat-template pages would spare the pool the preemptions.
    tiny = make_engine(
        max_total_tokens=max(len(p) for p in prompts) + 64, chunked_prefill_size=32, disable_radix_cache=True
    )
    outs = tiny.generate(prompts, params)
    assert tiny.scheduler.num_preemptions > 0
    assert [o.request_id for o in outs] == [o.request_id for o in ref]  # each once, in order
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]


def test_stop_strings_and_stop_tokens(make_engine, smollm2) -> None:
    engine = make_engine()
    prompt = _chat(smollm2[1], PROMPTS[0])
    full = engine.generate([prompt], GREEDY)[0]
    stop = full.text[10:14]
    cut = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=32, stop=[stop]))[0]
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.index(stop)]
    kept_params = SamplingParams(
        temperature=0, max_new_tokens=32, stop=[stop], include_stop_str_in_output=True
    )
    kept = engine.generate([prompt], kept_params)[0]
    assert kept.finish_reason == "stop" and kept.text == full.text[: full.text.index(stop) + len(stop)]
    tok_stop = engine.generate(
        [prompt], SamplingParams(temperature=0, max_new_tokens=32, stop_token_ids=[full.token_ids[3]])
    )[0]
    first = full.token_ids.index(full.token_ids[3])
    assert tok_stop.finish_reason == "stop" and tok_stop.token_ids == full.token_ids[: first + 1]
    eos = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=200))[0]
    assert eos.finish_reason == "stop" and eos.token_ids[-1] in smollm2[1].eos_token_ids


def test_min_new_tokens_and_logit_bias(make_engine, smollm2) -> None:
    engine = make_engine()
    tok = smollm2[1]
    prompt = _chat(tok, PROMPTS[0])
    eos = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=200))[0]
    n = len(eos.token_ids)
    assert eos.finish_reason == "stop" and eos.token_ids[-1] in tok.eos_token_ids
    held_params = SamplingParams(temperature=0, max_new_tokens=n + 8, min_new_tokens=n + 4)
    held = engine.generate([prompt], held_params)[0]
    assert held.token_ids[: n - 1] == eos.token_ids[: n - 1]  # the same greedy path up to the EOS
    assert len(held.token_ids) >= n + 4 and not set(held.token_ids[: n + 4]) & set(tok.eos_token_ids)
    stop = eos.text[:3]  # a stop string at the very start is not searched before min_new_tokens
    late_params = SamplingParams(temperature=0, max_new_tokens=8, min_new_tokens=8, stop=[stop])
    late = engine.generate([prompt], late_params)
    assert late[0].text.startswith(stop) and len(late[0].token_ids) == 8
    forced = tok.encode(" Paris")[0]
    biased = SamplingParams(temperature=0, max_new_tokens=3, ignore_eos=True, logit_bias={forced: 100})
    assert engine.generate([prompt], biased)[0].token_ids == [forced] * 3
    with pytest.raises(ValueError, match=r"logit_bias token id 49152 is out of range \[0, 49152\)"):
        engine.generate([prompt], SamplingParams(logit_bias={49152: 1.0}))


def test_chat_template_flag_reaches_generate(make_engine, smollm2, tmp_path) -> None:
    path = tmp_path / "plain.jinja"
    path.write_text("{% for m in messages %}Q: {{ m['content'] }}\n{% endfor %}A:")
    engine = make_engine(chat_template=str(path))
    ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": "Name a colour."}])
    assert ids == smollm2[1].encode("Q: Name a colour.\nA:", add_special_tokens=False)
    out = engine.generate([ids], SamplingParams(temperature=0, max_new_tokens=3))[0]
    assert out.completion_tokens >= 1


def test_logprobs_prompt_and_generated_agree(make_engine, smollm2) -> None:
    engine = make_engine()
    prompt = _chat(smollm2[1], PROMPTS[2])
    gen = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=4, logprobs=3))[0]
    assert gen.logprobs is not None and len(gen.logprobs) == 4
    assert all(lp.top_logprobs[0][0] == lp.token_id for lp in gen.logprobs)  # greedy = top-1
    scored = engine.generate([prompt + gen.token_ids], SamplingParams(max_new_tokens=0, prompt_logprobs=2))[0]
    tail = scored.prompt_logprobs[-4:]
    for a, b in zip(gen.logprobs, tail):
        assert a.token_id == b.token_id and abs(a.logprob - b.logprob) < 1e-3


def test_seeded_sampling_reproducible_across_batches(make_engine, smollm2) -> None:
    engine = make_engine()
    prompt = _chat(smollm2[1], PROMPTS[1])
    p = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=7, max_new_tokens=16)
    alone = engine.generate([prompt], p)[0]
    other = SamplingParams(temperature=1.0, max_new_tokens=16)
    batched = engine.generate([_chat(smollm2[1], PROMPTS[0]), prompt], [other, p])[1]
    assert alone.token_ids == batched.token_ids


def test_too_long_prompt_and_bad_ids(make_engine, smollm2) -> None:
    engine = make_engine(context_length=64)
    with pytest.raises(ValueError, match="context length is 64"):
        engine.generate([[5] * 64], GREEDY)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[]], GREEDY)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 49152\)"):
        engine.generate([[49152]], GREEDY)
    out = engine.generate([[5] * 60], SamplingParams(temperature=0, max_new_tokens=100, ignore_eos=True))[0]
    assert out.finish_reason == "length" and out.completion_tokens == 4  # clipped to the context
    small = make_engine(max_total_tokens=32, kv_cache_dtype="bf16")
    with pytest.raises(ValueError, match="max_total_num_tokens=32"):
        small.generate([[5] * 40], GREEDY)
