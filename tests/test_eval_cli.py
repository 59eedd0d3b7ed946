"""Calibration, passkey prompts and the ``eval kv`` / ``calibrate`` commands end to end (tiny sizes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nibblekv.cache import load_kv_scales
from nibblekv.cli import main
from nibblekv.eval.calibrate import AmaxRecorder, calibrate, checkpoint_scales
from nibblekv.eval.data import resolve_data_dir, token_windows
from nibblekv.eval.passkey import build_case, make_cases
from nibblekv.formats.nvfp4 import NVFP4_MAX
from nibblekv.model import DenseAttention

DATA = Path(__file__).parent / "data" / "austen"
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def _one_thread():  # type: ignore[no-untyped-def]
    # NOTE: the eval's many small tensor ops slow down ~100x when OpenMP threads outnumber free cores.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_amax_recorder_and_checkpoint_scales(tmp_path: Path) -> None:
    rec = AmaxRecorder(DenseAttention.single(3), num_layers=2)
    k = torch.tensor([[[1.0, -7.0]], [[2.0, 0.5]], [[0.0, 1.0]]])
    v = torch.full((3, 1, 2), 0.25)
    rec.forward(1, torch.zeros(3, 1, 2), k, v)
    assert rec.amax.tolist() == [[0.0, 0.0], [7.0, 0.25]]
    from safetensors.torch import save_file

    assert checkpoint_scales(tmp_path, 2) is None
    save_file(
        {
            f"model.layers.{i}.self_attn.{n}_scale": torch.tensor(0.5 + i + (n == "v"))
            for i in range(2)
            for n in "kv"
        },
        str(tmp_path / "model.safetensors"),
    )
    s = checkpoint_scales(tmp_path, 2)
    assert s is not None and s.k == (0.5, 1.5) and s.v == (1.5, 2.5) and s.source == "checkpoint"
    with pytest.raises(ValueError, match="some layers"):
        checkpoint_scales(tmp_path, 3)


def test_data_dir_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="--data-dir"):
        resolve_data_dir(tmp_path / "missing")
    assert resolve_data_dir(DATA) == DATA


def test_calibrate_scales_are_amax_over_2688(smollm2) -> None:  # type: ignore[no-untyped-def]
    model, tok = smollm2
    windows = token_windows(tok, [("n", (DATA / "northanger_abbey.txt").read_text())], 1, 24)
    scales = calibrate(model, windows)
    rec = AmaxRecorder(DenseAttention.single(24), model.config.num_layers)
    with torch.inference_mode():
        model.forward(windows[0], torch.arange(24), rec)
    assert torch.allclose(scales.tensor(), rec.amax / NVFP4_MAX)
    rotated = calibrate(model, windows, rotate=True)
    assert rotated.hadamard and rotated.k != scales.k


def test_passkey_prompt_is_exact_and_places_the_key(smollm2) -> None:  # type: ignore[no-untyped-def]
    _, tok = smollm2
    early, late = build_case(tok, 300, 0.0, 12345), build_case(tok, 300, 1.0, 12345)
    assert len(early.prompt) == len(late.prompt) == 300
    ids = tok.encode("12345", add_special_tokens=False)

    def where(p: tuple[int, ...]) -> int:
        return next(i for i in range(len(p)) if list(p[i : i + len(ids)]) == ids)

    assert where(early.prompt) < 60 and where(late.prompt) > 240
    cases = make_cases(tok, [200, 300], [0.25, 0.75])
    assert [(c.length, c.depth) for c in cases] == [(200, 0.25), (200, 0.75), (300, 0.25), (300, 0.75)]
    assert len({c.key for c in cases}) == 4 and make_cases(tok, [200, 300], [0.25, 0.75]) == cases


def test_calibrate_and_eval_kv_commands(smollm2, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from nibblekv.eval import calibrate_cli, cli

    for mod in (calibrate_cli, cli):
        monkeypatch.setattr(mod, "load", lambda args: smollm2)
    scales_path = tmp_path / "scales.json"
    base = ["--data-dir", str(DATA), "--calib-windows", "1", "--calib-tokens", "32"]
    assert main(["calibrate", *base, "--out", str(scales_path)]) == 0
    scales = load_kv_scales(scales_path, smollm2[0].config.num_layers, "cpu")
    assert bool((scales > 0).all()) and json.loads(scales_path.read_text())["source"] == "calibration"
    out = tmp_path / "acc.json"
    args = [
        "eval", "kv", *base, "--kv-scales-path", str(scales_path), "--windows", "2", "--window-tokens", "56",
        "--prefill-chunk", "32", "--decode-context", "40", "--decode-tokens", "4", "--batch", "2",
        "--configs", "fp8_e4m3", "nvfp4_plain", "nvfp4_cal", "--passkey-lengths", "160",
        "--passkey-depths", "0.5", "--passkey-configs", "bf16", "nvfp4_plain", "--out", str(out),
    ]  # fmt: skip
    assert main(args) == 0
    doc = json.loads(out.read_text())
    rows = {(r["config"], r["mode"]): r for r in doc["rows"]}
    assert set(rows) == {
        (c, m) for c in ("bf16", "fp8_e4m3", "nvfp4_plain", "nvfp4_cal") for m in ("prefill", "decode")
    }
    for r in doc["rows"]:
        assert {"kl", "top1", "ppl", "kl_ci", "ppl_delta"} <= set(r)
    assert rows[("bf16", "decode")]["kl"] < 1e-6 and rows[("nvfp4_plain", "decode")]["kl"] > 0
    assert doc["scales"]["plain"]["source"].startswith("file:")
    assert [s["config"] for s in doc["passkey_summary"]] == ["bf16", "nvfp4_plain"]
    assert out.with_suffix(".png").stat().st_size > 10_000
