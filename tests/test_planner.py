"""`nibblekv plan`: the published Llama 3.3 70B figures, the CLI, config paths and every error."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from nibblekv.cli import main
from nibblekv.formats import KVDtype, PageLayout
from nibblekv.model.presets import PRESETS, PUBLISHED_WEIGHTS_GIB, preset_config
from nibblekv.planner.plan import (
    GPUS,
    MemoryRule,
    PlanError,
    estimate_params,
    estimate_weights_gib,
    kv_bytes_per_token,
    plan_for,
    resolve_model,
    shape_from_config,
)

LLAMA = "llama-3.3-70b"


def _plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    """Run ``nibblekv plan ... --json`` and parse stdout."""
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _error_line(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run a failing ``nibblekv plan`` and return its single stderr line."""
    assert main(["plan", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("nibblekv plan: error: ")
    return lines[0]


# --------------------------------------------------------------------------- published figures


def test_llama33_bytes_per_token() -> None:
    shape = shape_from_config(PRESETS[LLAMA], LLAMA)
    assert shape.values_per_token == 163_840
    assert kv_bytes_per_token(shape, KVDtype.FP8) == 163_840
    assert kv_bytes_per_token(shape, KVDtype.NVFP4) == 92_160
    assert kv_bytes_per_token(shape, KVDtype.BF16) == 327_680


def test_bytes_per_token_matches_engine_page_layout() -> None:
    """The planner's per-token size is the engine's PageLayout size summed over layers."""
    for name, cfg in PRESETS.items():
        shape = shape_from_config(cfg, name)
        for dtype in (KVDtype.BF16, KVDtype.FP8, KVDtype.NVFP4):
            layout = PageLayout(dtype, shape.num_kv_heads, shape.head_dim, page_size=16)
            # NOTE: a hybrid model's KV lives only in its full-attention layers (num_kv_layers)
            assert kv_bytes_per_token(shape, dtype) == shape.num_kv_layers * layout.bytes_per_token(), (
                name,
                dtype,
            )


@pytest.mark.parametrize(
    ("context", "fp8_gib", "nvfp4_gib"),
    [(8192, 1.25, 0.703125), (131072, 20.0, 11.25)],
)
def test_llama33_gib_per_session(context: int, fp8_gib: float, nvfp4_gib: float) -> None:
    plan = plan_for(LLAMA, "H200", context, weights_gib=67.7)
    assert plan.kv_plan(KVDtype.FP8).gib_per_session == fp8_gib  # type: ignore[union-attr]
    assert plan.kv_plan(KVDtype.NVFP4).gib_per_session == nvfp4_gib  # type: ignore[union-attr]


def test_llama33_rtx_pro_6000_sessions() -> None:
    plan = plan_for(LLAMA, "RTX-PRO-6000-SE", 8192, weights_gib=67.7)
    assert plan.kv_plan(KVDtype.FP8).sessions == 12  # type: ignore[union-attr]
    assert plan.kv_plan(KVDtype.NVFP4).sessions == 21  # type: ignore[union-attr]


def test_llama33_h200_sessions_from_published_fp8_size() -> None:
    """No --weights-gib: the built-in table's 67.7 GiB FP8 checkpoint is used."""
    plan = plan_for(LLAMA, "h200", 8192, weights_dtype="fp8")
    assert plan.weights.gib == 67.7 and plan.weights.source == "published"
    assert GPUS["H200"].reported_gib * 1024 == 143_771
    assert plan.kv_plan(KVDtype.FP8).sessions == 44  # type: ignore[union-attr]


def test_tokens_and_sessions_are_consistent() -> None:
    plan = plan_for(LLAMA, "RTX-PRO-6000-SE", 8192, weights_gib=67.7)
    budget_bytes = plan.kv_budget_gib * 2**30
    for p in plan.kv:
        assert p.tokens * p.bytes_per_token <= budget_bytes < (p.tokens + 1) * p.bytes_per_token
        assert p.sessions == p.tokens // 8192


def test_exact_session_boundary_is_not_lost_to_rounding() -> None:
    """83.5 x 0.8 - 0.9 - 0.9 = 65 GiB = exactly 52 FP8 8K sessions (binary floats give 51)."""
    assert int((83.5 * 0.8 - 0.9 - 0.9) * 2**30 // 163_840) // 8192 == 51  # the float trap
    plan = plan_for(LLAMA, "83.5", 8192, weights_gib=0.9, rule=MemoryRule(0.8, 0.9))
    assert plan.kv_budget_gib == 65.0
    assert plan.kv_plan(KVDtype.FP8).sessions == 52  # type: ignore[union-attr]


def test_weights_that_do_not_fit_give_zero_not_negative() -> None:
    plan = plan_for(LLAMA, "H100", 8192)  # bf16 weights, ~131 GiB
    assert plan.weights.source == "estimated" and plan.kv_budget_gib < 0
    assert all(p.tokens == 0 and p.sessions == 0 for p in plan.kv)


# --------------------------------------------------------------------------- weights estimate


@pytest.mark.parametrize("dtype", ["fp8", "nvfp4"])
def test_estimate_reproduces_published_checkpoint_sizes(dtype: str) -> None:
    cfg = PRESETS[LLAMA]
    estimate = estimate_weights_gib(estimate_params(shape_from_config(cfg, LLAMA), cfg), dtype)
    assert estimate == pytest.approx(PUBLISHED_WEIGHTS_GIB[(LLAMA, dtype)], rel=0.005)


@pytest.mark.parametrize(
    ("name", "params"),
    [  # exact parameter counts of the Hugging Face checkpoints
        ("llama-3.3-70b", 70_553_706_496),
        ("llama-3.1-8b", 8_030_261_248),
        ("qwen3-8b", 8_190_735_360),
        ("qwen2.5-7b", 7_615_616_512),
        ("mistral-7b", 7_248_023_552),
        ("smollm2-135m", 134_515_008),
    ],
)
def test_parameter_count(name: str, params: int) -> None:
    cfg = PRESETS[name]
    assert estimate_params(shape_from_config(cfg, name), cfg).total == params


def test_bf16_weights_are_two_bytes_per_parameter() -> None:
    cfg = PRESETS["llama-3.1-8b"]
    count = estimate_params(shape_from_config(cfg, "llama-3.1-8b"), cfg)
    assert estimate_weights_gib(count, "bf16") == count.total * 2 / 2**30


# --------------------------------------------------------------------------- presets


def test_presets_are_valid_hf_configs() -> None:
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    for name in PRESETS:
        cfg = AutoConfig.for_model(**preset_config(name))
        text = getattr(cfg, "text_config", None) or cfg  # Qwen3.5: a vision-language config around the decoder
        expected = PRESETS[name].get("text_config", PRESETS[name])["num_hidden_layers"]
        assert cfg.torch_dtype is not None and text.num_hidden_layers == expected
    llama = PRESETS[LLAMA]
    assert llama["rope_scaling"]["rope_type"] == "llama3" and llama["head_dim"] == 128


def test_smollm2_preset_shape() -> None:
    shape = shape_from_config(PRESETS["smollm2-135m"], "smollm2-135m")
    assert (shape.num_layers, shape.num_heads, shape.num_kv_heads, shape.head_dim) == (30, 9, 3, 64)
    assert shape.tie_word_embeddings and shape.max_position_embeddings == 8192


def test_preset_config_is_a_copy() -> None:
    cfg = preset_config(LLAMA)
    cfg["rope_scaling"]["factor"] = 1.0
    assert PRESETS[LLAMA]["rope_scaling"]["factor"] == 8.0


# --------------------------------------------------------------------------- CLI


def test_acceptance_rtx_pro_6000(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _plan_json(
        capsys, "--model", LLAMA, "--gpu", "RTX-PRO-6000-SE", "--weights-gib", "67.7", "--context", "8192"
    )
    assert set(doc["kv"]) == {"bf16", "fp8_e4m3", "nvfp4"}
    assert set(doc["kv"]["nvfp4"]) == {"bytes_per_token", "gib_per_session", "tokens", "sessions"}
    assert doc["kv"]["fp8_e4m3"]["sessions"] == 12
    assert doc["kv"]["nvfp4"]["sessions"] == 21
    assert doc["kv"]["nvfp4"]["bytes_per_token"] == 92_160


def test_acceptance_h200(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _plan_json(capsys, "--model", LLAMA, "--gpu", "H200", "--weights-gib", "67.7", "--context", "8192")
    assert doc["kv"]["fp8_e4m3"]["sessions"] == 44
    assert doc["kv"]["fp8_e4m3"]["gib_per_session"] == 1.25


def test_context_k_suffix(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _plan_json(capsys, "--model", LLAMA, "--gpu", "H200", "--weights-gib", "67.7", "--context", "128k")
    assert doc["context"] == 131072
    assert doc["kv"]["fp8_e4m3"]["gib_per_session"] == 20.0
    assert doc["kv"]["nvfp4"]["gib_per_session"] == 11.25


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "plan",
        "--model",
        LLAMA,
        "--gpu",
        "RTX-PRO-6000-SE",
        "--weights-gib",
        "67.7",
        "--context",
        "8192",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "163,840" in out and "92,160" in out
    assert "nvfp4 vs fp8_e4m3: 0.5625x bytes per token, 1.75x sessions (21 vs 12)" in out


def test_gpu_as_gib_and_memory_rule(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _plan_json(
        capsys, "--model", LLAMA, "--gpu", "100", "--weights-gib", "40", "--context", "8192",
        "--mem-fraction", "1", "--reserve-gib", "0",
    )  # fmt: skip
    assert doc["memory"]["kv_budget_gib"] == 60.0
    assert doc["kv"]["fp8_e4m3"]["sessions"] == 48  # 60 / 1.25


def test_config_json_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = preset_config("llama-3.1-70b")  # no head_dim: derived from hidden_size / heads
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    for spec in (str(path), str(tmp_path)):
        doc = _plan_json(
            capsys, "--model", spec, "--gpu", "RTX-PRO-6000-SE", "--weights-gib", "67.7", "--context", "8k"
        )
        assert doc["model"]["head_dim"] == 128
        assert doc["kv"]["fp8_e4m3"]["sessions"] == 12
        assert doc["kv"]["nvfp4"]["sessions"] == 21


def test_config_path_weights_are_estimated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(preset_config(LLAMA)))
    doc = _plan_json(
        capsys, "--model", str(path), "--gpu", "H200", "--weights-dtype", "fp8", "--context", "8192"
    )
    assert doc["weights"]["source"] == "estimated"
    assert doc["weights"]["gib"] == pytest.approx(67.7, rel=0.005)


def test_full_attention_qwen25_with_inactive_window_is_accepted() -> None:
    """Qwen2.5 sets sliding_window but use_sliding_window is false: full attention, sized."""
    plan = plan_for("qwen2.5-7b", "H100", 32768)
    assert plan.kv_plan(KVDtype.FP8).bytes_per_token == 2 * 28 * 4 * 128  # type: ignore[union-attr]


def test_context_beyond_model_limit_warns(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "smollm2-135m", "--gpu", "H100", "--context", "16k"]) == 0
    assert (
        "warning: context 16384 exceeds the model's max_position_embeddings 8192" in capsys.readouterr().err
    )


# --------------------------------------------------------------------------- errors


def _write(tmp_path: Path, cfg: dict[str, Any]) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _edited(name: str, **changes: Any) -> dict[str, Any]:
    cfg = preset_config(name)
    for key, value in changes.items():
        if value is _DROP:
            cfg.pop(key)
        else:
            cfg[key] = value
    return cfg


_DROP = object()
_BASE = ["--gpu", "H200", "--weights-gib", "67.7", "--context", "8192"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--model", "llama-9-9000b", *_BASE], "unknown model 'llama-9-9000b'"),
        (["--model", LLAMA, "--gpu", "A100-XL", "--context", "8192"], "unknown GPU 'A100-XL'"),
        (["--model", LLAMA, "--gpu", "-80", "--context", "8192"], "GPU memory must be a positive"),
        (["--model", LLAMA, "--gpu", "H200", "--context", "0"], "--context must be a positive"),
        (["--model", LLAMA, "--gpu", "H200", "--context", "-8192"], "--context must be a positive"),
        ([*_BASE[:4], "--model", LLAMA, "--context", "8192", "--mem-fraction", "1.5"], "--mem-fraction"),
        ([*_BASE[:4], "--model", LLAMA, "--context", "8192", "--reserve-gib", "-1"], "--reserve-gib"),
        (["--model", LLAMA, "--gpu", "H200", "--weights-gib", "-1", "--context", "8192"], "--weights-gib"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    assert needle in _error_line(capsys, *argv)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"num_hidden_layers": _DROP}, "'num_hidden_layers'"),
        ({"num_attention_heads": _DROP}, "'num_attention_heads'"),
        ({"head_dim": _DROP, "hidden_size": _DROP}, "'head_dim'"),
        ({"num_key_value_heads": 0}, "'num_key_value_heads'"),
        ({"kv_lora_rank": 512}, "kv_lora_rank"),
        ({"sliding_window": 4096}, "sliding_window=4096"),
        ({"layer_types": ["sliding_attention", "full_attention"] * 40}, "'layer_types'"),
        ({"attention_chunk_size": 8192}, "'attention_chunk_size'"),
    ],
)
def test_bad_config_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], needle: str
) -> None:
    path = _write(tmp_path, _edited(LLAMA, **changes))
    assert needle in _error_line(capsys, "--model", path, *_BASE)


def test_config_without_attention_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, {"architectures": ["Foo"], "text_config": {"num_hidden_layers": 4}})
    line = _error_line(capsys, "--model", path, *_BASE)
    assert "'num_hidden_layers'" in line and "text_config" in line


def test_qwen_sliding_window_enabled_is_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, _edited("qwen2.5-7b", use_sliding_window=True))
    assert "sliding_window=131072" in _error_line(capsys, "--model", path, *_BASE)


def test_unreadable_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json")
    assert "cannot read model config" in _error_line(capsys, "--model", str(path), *_BASE)


def test_weights_estimate_needs_size_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, _edited(LLAMA, intermediate_size=_DROP))
    line = _error_line(capsys, "--model", path, "--gpu", "H200", "--context", "8192")
    assert "'intermediate_size'" in line and "--weights-gib" in line


def test_moe_weights_need_explicit_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, _edited("mistral-7b", num_local_experts=8))
    assert "mixture-of-experts" in _error_line(capsys, "--model", path, "--gpu", "H200", "--context", "8192")


def test_quantized_config_needs_weights_dtype(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, _edited(LLAMA, quantization_config={"quant_method": "awq", "bits": 4}))
    assert "quantization_config" in _error_line(capsys, "--model", path, "--gpu", "H200", "--context", "8192")


@pytest.mark.parametrize(
    "qc",
    [
        {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
        {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {}},
    ],
)
def test_fp8_checkpoint_config_plans_fp8_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], qc: dict[str, Any]
) -> None:
    """An FP8 checkpoint's config sizes its weights at 1 byte per linear parameter, as --weights-dtype fp8."""
    doc = _plan_json(capsys, "--model", _write(tmp_path, _edited(LLAMA, quantization_config=qc)), "--gpu", "H200",
                     "--context", "8192")  # fmt: skip
    assert doc["weights"]["dtype"] == "fp8" and doc["weights"]["gib"] == pytest.approx(67.7, rel=0.005)


def test_nvfp4_unsupported_head_dim_is_explicit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """head_dim 72 cannot hold 16-element NVFP4 blocks: reported as unsupported, not sized."""
    cfg = _edited("smollm2-135m", head_dim=72, num_attention_heads=8)
    with pytest.raises(PlanError, match="head_dim % 16"):
        kv_bytes_per_token(shape_from_config(cfg, "odd"), KVDtype.NVFP4)
    doc = _plan_json(capsys, "--model", _write(tmp_path, cfg), "--gpu", "H100", "--context", "4096")
    assert set(doc["kv"]) == {"bf16", "fp8_e4m3"}
    assert "head_dim % 16" in doc["unsupported_kv"]["nvfp4"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", LLAMA, "--gpu", "H200"],  # no --context
        ["--model", LLAMA, "--gpu", "H200", "--context", "lots"],
        ["--model", LLAMA, "--gpu", "H200", "--context", "8192", "--weights-dtype", "int3"],
    ],
)
def test_argparse_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plan", *argv])
    assert info.value.code == 2
    assert "nibblekv plan: error:" in capsys.readouterr().err


def test_context_accepts_k_and_m_suffixes() -> None:
    from nibblekv.planner.cli import parse_context

    assert parse_context("8192") == 8192
    assert parse_context("128k") == 131072
    assert parse_context("1M") == 1048576
    with pytest.raises(argparse.ArgumentTypeError):
        parse_context("1g")


def test_hub_id_plans_from_its_fetched_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import huggingface_hub

    (tmp_path / "config.json").write_text(json.dumps(preset_config("llama-3.1-8b")))
    asked: list[dict[str, Any]] = []

    def fake(**kwargs: Any) -> str:
        asked.append(kwargs)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    name, cfg = resolve_model("meta-llama/Llama-3.1-8B")
    assert name == "meta-llama/Llama-3.1-8B" and cfg == preset_config("llama-3.1-8b")
    assert asked[0]["repo_id"] == name and "*.safetensors" not in asked[0]["allow_patterns"]  # config only

    def offline(**kwargs: Any) -> str:
        raise huggingface_hub.errors.LocalEntryNotFoundError("no cached copy")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(PlanError, match="not fetched from the Hugging Face Hub: no cached copy"):
        resolve_model("org/absent")
