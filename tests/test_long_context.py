"""Long context: --context-length past the model's positions needs --allow-long-context (RoPE scaling from the
config or the overrides, logged), the page table is paid from the KV budget, and ``nibblekv plan`` counts the
resident requests the engine's own sizing reaches (tail, sink and prefill pages, page rounding, table rows)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nibblekv.cli import main
from nibblekv.config import EngineConfig
from nibblekv.engine import Engine
from nibblekv.engine.setup import page_table_bytes, pool_spec, resident_capacity
from nibblekv.formats import KVDtype
from nibblekv.model.config import ModelConfig
from nibblekv.model.presets import PRESETS
from nibblekv.planner.engine_fit import EngineOptions, resident_requests
from nibblekv.planner.shape import shape_from_config

TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 320, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "bos_token_id": 256, "eos_token_id": 257,
}  # fmt: skip
LLAMA3_1K = {"rope_type": "llama3", "factor": 64.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64}  # fmt: skip


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    return tmp_path


def _engine(model: Path, **kw: object) -> Engine:
    cfg = EngineConfig(model=str(model), load_format="dummy", device="cpu", max_total_tokens=4096)
    return Engine(cfg, **kw)


def test_context_length_past_the_model_is_refused_without_the_flag(tiny_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"--context-length 1024 exceeds .* 256; pass --allow-long-context"):
        _engine(tiny_dir, context_length=1024)
    assert _engine(tiny_dir, context_length=256).context_len == 256  # up to the model's positions: fine


def test_allow_long_context_serves_it_and_logs_lengths_and_rope(
    tiny_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    override = json.dumps({"rope_scaling": LLAMA3_1K})
    with caplog.at_level(logging.WARNING, logger="nibblekv"):
        engine = _engine(
            tiny_dir, context_length=1024, allow_long_context=True, json_model_override_args=override
        )
    assert engine.context_len == 1024 and engine.page_table.main.shape[1] == 1024 // 16 + 1
    rope = engine.model.config.rope_scaling  # the override reached the model's RoPE
    assert (rope.rope_type, rope.factor, rope.original_max_position_embeddings) == ("llama3", 64.0, 64)
    line = next(r.getMessage() for r in caplog.records if "--allow-long-context" in r.getMessage())
    assert (
        "context length 1024" in line
        and "max_position_embeddings 256" in line
        and "llama3 (factor 64.0" in line
    )
    from nibblekv.engine import SamplingParams

    out = engine.generate(
        [[10 + i % 300 for i in range(390)]], SamplingParams(max_new_tokens=4, ignore_eos=True)
    )[0]
    assert out.prompt_tokens == 390 and out.completion_tokens == 4  # past position 256, through the table


def test_cli_refuses_before_loading_and_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "generate",
        "--model",
        "llama-3.1-8b",
        "--load-format",
        "dummy",
        "--context-length",
        "1048576",
        "hi",
    ]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--context-length 1048576 exceeds the model's max_position_embeddings 131072" in err
    assert "--allow-long-context" in err


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_cli_refuses_a_gguf_past_its_positions_before_loading(command: str) -> None:
    """The bundled GGUF's header gives its 8192 positions: one line, exit 2, no traceback, no server."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "nibblekv", command, "--context-length", "65536"]
    if command == "generate":
        argv.append("hi")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "exceeds the model's max_position_embeddings 8192" in proc.stderr
    assert "Load weight end" not in proc.stderr


def _fake_model(name: str) -> SimpleNamespace:
    """What pool_spec reads of a model (config, dtype, device), without building one."""
    return SimpleNamespace(
        config=ModelConfig.from_hf(PRESETS[name]), dtype=torch.bfloat16, device=torch.device("cpu")
    )


# (model, input tokens, budget GiB): the published lengths on an H200-sized budget and a tight one
CASES = [
    ("llama-3.1-8b", 32768, 100.0),
    ("llama-3.1-8b", 163840, 100.0),
    ("llama-3.1-8b", 1048576, 100.0),
    ("llama-3.1-8b", 1048576, 40.0),  # nvfp4 holds one, fp8 none
    ("qwen3-32b", 163840, 60.0),
    ("smollm2-135m", 4096, 0.05),
]


@pytest.mark.parametrize(("name", "input_len", "gib"), CASES)
@pytest.mark.parametrize("kv", ["bf16", "fp8_e4m3", "nvfp4"])
def test_planner_resident_requests_match_the_engine_sizing(
    name: str, input_len: int, gib: float, kv: str
) -> None:
    page, output_len = 16, 1024
    context = input_len + output_len + page  # as the long-context benchmark sets --context-length
    per_request = (-(-(input_len + output_len) // page) + 1) * page
    cfg = EngineConfig(kv_cache_dtype=kv, mem_budget_gib=gib, chunked_prefill_size=8192)
    engine_n = resident_capacity(cfg, _fake_model(name), per_request, context)  # type: ignore[arg-type]
    opts = EngineOptions(page_size=page, kv_recent_window=cfg.kv_recent_window, chunked_prefill_size=8192)
    shape = shape_from_config(PRESETS[name], name)
    plan_n = resident_requests(shape, KVDtype(kv), int(gib * (1 << 30)), per_request, context, opts)
    assert plan_n == engine_n


def test_planner_cli_prints_the_engine_count(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", "llama-3.1-8b", "--gpu", "H200", "--context", "1049616", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    requests = doc["engine"]["requests"]
    assert requests["nvfp4"] >= 2 * requests["fp8_e4m3"] >= 2  # the 1M row of the published table: 1 -> 2
    assert requests["nvfp4"] <= doc["kv"]["nvfp4"]["sessions"]  # tails and tables only take away


def test_page_table_rows_are_paid_from_the_kv_budget() -> None:
    model = _fake_model("llama-3.1-8b")
    cfg = EngineConfig(kv_cache_dtype="nvfp4", mem_budget_gib=100.0)
    short = pool_spec(cfg, model, 128, 4096)  # type: ignore[arg-type]
    long = pool_spec(cfg, model, 128, 1 << 20)  # type: ignore[arg-type]
    table = page_table_bytes(long, 128, 1 << 20) - page_table_bytes(short, 128, 4096)
    assert page_table_bytes(long, 128, 1 << 20) > 32 << 20  # 129 rows of 65K+ int32 page ids
    page_bytes = long.main_bytes() // long.num_pages
    assert short.num_pages - long.num_pages in (table // page_bytes, table // page_bytes + 1)


@pytest.mark.parametrize("rope", [
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},  # Qwen3's 128K recipe
    {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 32768, "beta_fast": 16,
     "beta_slow": 2},
    {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
     "mscale_all_dim": 0.707},
])  # fmt: skip
def test_yarn_equals_transformers(rope: dict[str, object]) -> None:
    """YaRN's frequencies and cos/sin scale (HF's attention_scaling) as transformers computes them."""
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from nibblekv.model.rope import RotaryEmbedding

    raw = {**PRESETS["qwen3-8b"], "rope_scaling": rope, "max_position_embeddings": 131072}
    ref, attention = ROPE_INIT_FUNCTIONS["yarn"](Qwen3Config(**raw), torch.device("cpu"))
    cfg = ModelConfig.from_hf(raw)
    rotary = RotaryEmbedding(cfg)
    torch.testing.assert_close(rotary.inv_freq, ref.to(torch.float32), rtol=1e-6, atol=0)
    assert cfg.rope_scaling.attention_factor == pytest.approx(attention, rel=1e-12) and attention != 1.0
    cos, _ = rotary.cos_sin(torch.tensor([0]), torch.float32)
    assert cos[0, 0, 0].item() == pytest.approx(attention)  # cos(0) scaled


def test_yarn_override_reaches_the_engine_log(tiny_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    override = json.dumps(
        {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}}
    )
    with caplog.at_level(logging.WARNING, logger="nibblekv"):
        engine = _engine(
            tiny_dir, context_length=1024, allow_long_context=True, json_model_override_args=override
        )
    assert engine.model.config.rope_scaling.rope_type == "yarn"
    assert any("RoPE scaling: yarn (factor 4.0, original_max_position_embeddings 256" in r.getMessage()
               for r in caplog.records)  # fmt: skip
