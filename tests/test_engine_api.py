"""The async streaming interface and the ``nibblekv generate`` CLI, on a tiny random-weight model."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import pytest

from nibblekv.cli import main
from nibblekv.engine import AsyncEngine, Engine, SamplingParams

TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 320,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "bos_token_id": 256,
    "eos_token_id": 257,
}


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tiny") / "config.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def _engine_flags(cfg: str) -> list[str]:
    return [
        "--load-format",
        "dummy",
        "--model",
        cfg,
        "--max-total-tokens",
        "1024",
        "--kv-cache-dtype",
        "nvfp4",
    ]


@pytest.mark.parametrize("overlap", [False, True])
def test_async_engine_streams_and_aborts(tiny_config: str, overlap: bool) -> None:
    engine = AsyncEngine(
        load_format="dummy", model=tiny_config, max_total_tokens=1024, kv_cache_dtype="nvfp4",
        enable_overlap_schedule=overlap,
    )  # fmt: skip
    params = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)

    async def stream() -> list:
        return [out async for out in engine.generate("hello", params, request_id="a")]

    async def abort_after(n: int) -> list:
        got = []
        async for out in engine.generate("hello again", SamplingParams(max_new_tokens=200, ignore_eos=True)):
            got.append(out)
            if len(got) == n:
                engine.abort(out.request_id)
        return got

    async def both() -> tuple[list, list]:
        return await asyncio.gather(stream(), abort_after(3))

    try:
        outs, aborted = asyncio.run(both())
        assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
        assert "".join(o.text_delta for o in outs) == outs[-1].text
        assert outs[-1].completion_tokens == 12 and outs[-1].finish_reason == "length"
        assert aborted[-1].finished and aborted[-1].finish_reason == "abort"
        assert aborted[-1].completion_tokens < 200
        stats = engine.stats()
        assert stats["running"] == 0 and stats["queued"] == 0 and stats["used_tokens"] == 0
        assert stats["kv_cache_dtype"] == "nvfp4" and stats["aborted_requests_total"] == 1
        assert engine.is_healthy()
        with pytest.raises(ValueError, match="context length"):
            asyncio.run(anext(engine.generate([5] * 300, params)))
        ref = Engine(
            loaded=(engine.engine.model, engine.tokenizer), max_total_tokens=1024, kv_cache_dtype="nvfp4"
        )
        assert ref.generate("hello", params)[0].token_ids == outs[-1].token_ids
    finally:
        engine.shutdown()
    assert not engine.is_healthy()


def test_cli_generate_prints_text_and_summary(
    tiny_config: str, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="nibblekv")
    assert main(["generate", "hi there", "--max-new-tokens", "5", *_engine_flags(tiny_config)]) == 0
    captured = capsys.readouterr()
    assert captured.out.endswith("\n")  # the (random-weight) text
    summary = [line for line in captured.err.splitlines() if line.startswith("[summary]")]
    assert summary and "tokens: 5," in summary[0] and "KV dtype: nvfp4" in summary[0]
    assert "resident-token capacity: 1024 (+" in summary[0]
    assert "KV cache is allocated. dtype: nvfp4, #tokens: 1024, K size: " in caplog.text
    assert "max_total_num_tokens=1024, max_running_requests=32, context_len=256, page_size=16" in caplog.text


def test_cli_generate_runs_with_the_startup_heap_frozen(
    tiny_config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Full GC passes skip the start-up heap while the engine generates, and the heap is unfrozen after
    (engine/gc_heap.py): a frozen dropped engine would never be freed."""
    import gc

    from nibblekv.engine.engine import Engine

    seen: list[int] = []
    real = Engine.generate

    def generate(self: Engine, *args: object, **kwargs: object) -> object:
        seen.append(gc.get_freeze_count())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate", generate)
    assert main(["generate", "hi", "--max-new-tokens", "2", *_engine_flags(tiny_config)]) == 0
    assert seen and seen[0] > 1000  # torch, the model, the engine
    assert gc.get_freeze_count() == 0


def test_frozen_heap_unfreezes_on_error() -> None:
    import gc

    from nibblekv.engine.gc_heap import frozen_heap

    with pytest.raises(RuntimeError), frozen_heap():
        assert gc.get_freeze_count() > 0
        raise RuntimeError("inside")
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--kv-cache-dtype", "int4"], "--kv-cache-dtype"),
        (["--page-size", "0"], "--page-size"),
        (["--mem-fraction-static", "1.5"], "--mem-fraction-static"),
        (["--kv-recent-window", "10"], "--kv-recent-window must be a multiple of page_size"),
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "0"], "top_p"),
        (["--json-model-override-args", "[4]"], "--json-model-override-args must be a JSON object"),
        (["--json-model-override-args", "{layers: 4}"], "--json-model-override-args is not valid JSON"),
    ],
)
def test_cli_bad_flags_exit_2(flags: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["generate", "x", *flags])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_batch_is_resumable(tiny_config: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = [{"prompt": f"prompt {i}", "sampling_params": {"max_new_tokens": 3 + i}} for i in range(4)]
    rows[3] = {"id": "msg", "messages": [{"role": "user", "content": "hey"}]}
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["generate", "--input-jsonl", str(inp), "--output-jsonl", str(out), "--max-new-tokens", "4"]
    argv += ["--ignore-eos", *_engine_flags(tiny_config)]

    # First run: Ctrl-C after the first finished request has been written.
    real_step = Engine.step

    def interrupted_step(self: Engine) -> list:
        if out.exists() and out.read_text():
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(Engine, "step", interrupted_step)
    assert main(argv) == 130  # Ctrl-C: exit 130 with one line, no traceback (tests/test_cli_face.py)
    first = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(first) >= 1
    with out.open("a") as f:
        f.write('{"id": "torn", "te')  # a line cut off mid-write
    monkeypatch.setattr(Engine, "step", real_step)
    assert main(argv) == 0
    done = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(d["id"] for d in done) == ["0", "1", "2", "msg"]  # each exactly once, torn line dropped
    assert done[: len(first)] == first
    by_id = {d["id"]: d for d in done}
    assert [by_id[str(i)]["completion_tokens"] for i in range(3)] == [3, 4, 5]
    assert by_id["msg"]["completion_tokens"] == 4


def test_json_model_override_args_reshape_the_model(tiny_config: str) -> None:
    # SGLang's flag: a big model's shape with fewer layers (here 1 of the tiny config's layers)
    engine = Engine(load_format="dummy", model=tiny_config, max_total_tokens=256,
                    json_model_override_args='{"num_hidden_layers": 1}')  # fmt: skip
    assert engine.model.config.num_layers == 1 and len(engine.pool.main) == 1
    out = engine.generate(["a"], SamplingParams(temperature=0, max_new_tokens=3, ignore_eos=True))
    assert len(out[0].token_ids) == 3
    with pytest.raises(ValueError, match="not a GGUF"):
        Engine(json_model_override_args='{"num_hidden_layers": 1}', max_total_tokens=256)


def test_decode_log_line_and_kv_scales(
    tiny_config: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import re

    scales = tmp_path / "scales.json"
    scales.write_text(json.dumps({"k_scale": [0.5, 0.25], "v_scale": [2.0, 4.0]}))
    caplog.set_level("INFO", logger="nibblekv")
    engine = Engine(
        load_format="dummy", model=tiny_config, max_total_tokens=512, kv_cache_dtype="fp8_e4m3",
        kv_scales_path=str(scales), decode_log_interval=2,
    )  # fmt: skip
    assert engine.pool.main[1].global_scale.tolist() == [0.25, 4.0]
    engine.generate(["a", "b", "c"], SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True))
    pattern = (
        r"Decode batch\. #running-req: \d+, #token: \d+, token usage: \d\.\d\d, cuda graph: False, "
        r"gen throughput \(token/s\): [\d.]+, #queue-req: \d+"
    )
    lines = [m for m in caplog.messages if m.startswith("Decode batch.")]
    assert lines and all(re.fullmatch(pattern, m) for m in lines)
    assert "#running-req: 3," in lines[0]
    prefill = (
        r"Prefill batch\. #new-seq: \d+, #new-token: \d+, #cached-token: \d+, token usage: \d\.\d\d, "
        r"#running-req: \d+, #queue-req: \d+"
    )
    plines = [m for m in caplog.messages if m.startswith("Prefill batch.")]
    assert plines and all(re.fullmatch(prefill, m) for m in plines)
    assert "#new-seq: 3," in plines[0]


def test_server_warm_up_runs_requests_and_leaves_no_pages(tiny_config: str) -> None:
    # `nibblekv serve` runs a few requests before the port opens (--skip-server-warmup turns it off): short
    # and long fresh prompts, then the long one extended; the prefix cache is flushed afterwards
    pytest.importorskip("uvicorn")
    from nibblekv.server.cli import add_server_args
    from nibblekv.server.launch import WARMUP_PROMPT_TOKENS, engine_facts, warm_up

    engine = AsyncEngine(
        load_format="dummy", model=tiny_config, max_total_tokens=1024, kv_cache_dtype="nvfp4"
    )
    try:
        facts = engine_facts(engine)  # context 256 here: the long prompt is cut to fit
        secs = warm_up(engine, min(facts["context_length"], facts["kv_capacity_tokens"]), facts["vocab_size"])
        stats = engine.stats()
        assert secs > 0 and stats["running"] == 0 and stats["queued"] == 0
        assert engine.engine.pool.all_free()  # flushed: an idle server holds no pages
        assert engine.engine.stats.finished_requests == len(WARMUP_PROMPT_TOKENS) + 1
    finally:
        engine.shutdown()
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    assert not parser.parse_args([]).skip_server_warmup
    assert parser.parse_args(["--skip-server-warmup"]).skip_server_warmup
