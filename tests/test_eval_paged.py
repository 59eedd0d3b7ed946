"""The eval's engine path on SmolLM2: teacher-forced runs through the real pool and paged backend."""

from __future__ import annotations

import pytest
import torch

from nibblekv.eval.configs import KVConfig, parse_config
from nibblekv.eval.kv_eval import EvalSettings, LockstepEval
from nibblekv.eval.metrics import summarize
from nibblekv.eval.paged_runner import PagedRunner
from nibblekv.model import DenseAttention

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def _one_thread():  # type: ignore[no-untyped-def]
    # NOTE: the eval's many small tensor ops slow down ~100x when OpenMP threads outnumber free cores.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def windows(smollm2) -> torch.Tensor:  # type: ignore[no-untyped-def]
    from pathlib import Path

    from nibblekv.eval.data import eval_texts, token_windows

    _, tok = smollm2
    return token_windows(tok, eval_texts(Path(__file__).parent / "data" / "austen"), 2, 80)


def _dense_logits(model, ids: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    with torch.inference_mode():
        h = model.forward(ids, torch.arange(ids.numel()), DenseAttention.single(ids.numel()))
        return model.compute_logits(h)


def test_chunked_prefill_and_decode_match_dense(smollm2, windows: torch.Tensor) -> None:  # type: ignore[no-untyped-def]
    model, _ = smollm2
    ids = windows[0, :40]
    ref = _dense_logits(model, ids)
    runner = PagedRunner(model, parse_config("bf16"), max_requests=1, max_len=48)
    runner.start(1)
    rows = [runner.step([ids[:16].tolist()]), runner.step([ids[16:32].tolist()])]
    rows += [runner.step([[int(t)]]) for t in ids[32:]]  # decode path, one token at a time
    got = model.compute_logits(torch.cat(rows))
    assert torch.allclose(got, ref, atol=2e-3, rtol=1e-3)
    # the runner frees every page it took
    runner.release()
    assert runner.pool.all_free()


def test_quantized_runs_differ_and_tail_hides_quantization(smollm2, windows: torch.Tensor) -> None:  # type: ignore[no-untyped-def]
    model, _ = smollm2
    ids = windows[1, :40].tolist()

    def run(cfg: KVConfig) -> torch.Tensor:
        r = PagedRunner(model, cfg, max_requests=1, max_len=48)
        r.start(1)
        r.step([ids[:24]])
        out = torch.cat([r.step([[t]]) for t in ids[24:]])
        r.release()
        return model.compute_logits(out)

    base, plain = run(parse_config("bf16")), run(parse_config("nvfp4_plain"))
    assert float((plain - base).abs().max()) > 0.05  # the decode steps read quantized K/V
    # a 64-token tail holds all 40 tokens: nothing is ever quantized
    assert torch.allclose(run(KVConfig("w64", window=64)), base, atol=1e-4)
    # the Hadamard rotation leaves an unquantized cache's results unchanged
    rotated = KVConfig("rot", kv_dtype="nvfp4", window=64, hadamard=True)
    assert torch.allclose(run(rotated), base, atol=1e-3)
    had = run(parse_config("nvfp4_had"))
    assert float((had - plain).abs().max()) > 1e-3


def test_runner_rejects_what_the_cache_cannot_do(smollm2) -> None:  # type: ignore[no-untyped-def]
    model, _ = smollm2
    with pytest.raises(ValueError, match="sink"):
        PagedRunner(model, parse_config("nvfp4_s4"), max_requests=1, max_len=16)
    with pytest.raises(ValueError, match="multiple of page_size"):
        PagedRunner(model, parse_config("nvfp4_w8"), max_requests=1, max_len=16)
    with pytest.raises(ValueError, match="smoothing"):
        PagedRunner(model, parse_config("nvfp4_w64_smk"), max_requests=1, max_len=16)  # passkey too
    with pytest.raises(ValueError, match="calibrated"):
        PagedRunner(model, parse_config("nvfp4_cal"), max_requests=1, max_len=16)
    with pytest.raises(ValueError, match="needs _w"):
        parse_config("nvfp4_sink")  # the sink page lives in the tail pool
    with pytest.raises(ValueError, match="needs _w"):
        parse_config("nvfp4_pw")  # the prefill window extends the tail
    sink = parse_config("nvfp4_w64_4o6_had_sink_pw")
    assert sink.sink_pages == 1 and sink.sink_tokens == 16 and sink.renamed("nvfp4") == parse_config("nvfp4")


def test_lockstep_eval_both_modes(smollm2, windows: torch.Tensor) -> None:  # type: ignore[no-untyped-def]
    model, _ = smollm2
    settings = EvalSettings(
        windows=2, window_tokens=80, prefill_chunk=32, decode_context=48, decode_tokens=8, batch=2
    )
    names = ("bf16", "nvfp4_plain", "nvfp4_w16", "nvfp4_w48", "nvfp4_w16_sink", "nvfp4_w16_pw")
    configs = [parse_config(n) for n in names]
    ev = LockstepEval(model, configs, settings, lambda c: None)
    pre, dec = ev.run_prefill(windows), ev.run_decode(windows)
    # prefill scores the tokens after the first chunk, decode every step
    assert pre["bf16"].count == [79 - 32] * 2 and dec["bf16"].count == [8, 8]
    summary = {
        (name, mode): summarize(accs[name], accs["bf16"])
        for mode, accs in (("prefill", pre), ("decode", dec))
        for name in accs
    }
    for mode in ("prefill", "decode"):
        assert summary[("bf16", mode)]["kl"] < 1e-6 and summary[("bf16", mode)]["top1"] == 1.0
        assert summary[("nvfp4_plain", mode)]["kl"] > summary[("nvfp4_w48", mode)]["kl"] > 0
    # A chunk attends over the layout before its growth: even a tail shorter than the 32-token chunk
    # keeps the newest 16 cached tokens in bf16 for it (they are demoted after the chunk attends).
    assert summary[("nvfp4_w16", "prefill")]["kl"] < summary[("nvfp4_plain", "prefill")]["kl"]
    assert summary[("nvfp4_w16", "decode")]["kl"] < summary[("nvfp4_plain", "decode")]["kl"]
    # The sink page: later chunks and decode steps read page 0 (the attention sinks) in bf16.
    for mode in ("prefill", "decode"):
        assert summary[("nvfp4_w16_sink", mode)]["kl"] < summary[("nvfp4_w16", mode)]["kl"]
    # The prefill window: each non-final chunk keeps itself + W = 48 tokens in bf16, so chunk 2 reads all
    # of chunk 1 unquantized; decode's context is one (final) chunk: no difference there.
    assert summary[("nvfp4_w16_pw", "prefill")]["kl"] < 0.5 * summary[("nvfp4_w16", "prefill")]["kl"]
    assert summary[("nvfp4_w16_pw", "decode")]["kl"] == summary[("nvfp4_w16", "decode")]["kl"]
    with pytest.raises(ValueError):
        LockstepEval(model, configs[1:], settings, lambda c: None)
