"""benchmarks/bench_fp8.py --smoke: the device benchmark's code path on CPU (interpreter / reference)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import bench_fp8, fp8_tma  # noqa: E402


def test_bench_fp8_smoke_writes_rows_and_plot(tmp_path: Path) -> None:
    assert bench_fp8.main(["--smoke", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "fp8-weights-cpu.json").read_text())  # named by the device (timing.gpu_tag)
    assert {"commit", "gpu", "date", "rows", "acceptance"} <= set(doc)
    rows = doc["rows"]
    assert len(rows) == len(bench_fp8.SHAPES_SMOKE) * len(bench_fp8.MS_SMOKE) * len(bench_fp8.FORMATS)
    for r in rows:
        assert r["kind"] == "gemm" and r["format"] in ("channel", "block")
        assert all(r[key] > 0 for key in ("m", "n", "k", "fp8_us", "fp8_gemm_us", "bf16_us"))
        assert ("read_frac" in r) == (r["m"] <= 16)
        # every decode tile of either format compiled, checked against the twin and timed (block: also the
        # default tile with its scales loaded in each step; up to 32 tokens the default tile not swapped)
        extra = {"default_in_step"} if r["format"] == "block" else set()
        extra |= {"default_unswapped"} if r["m"] <= 32 else set()
        assert set(r["decode_tiles_us"]) == set(bench_fp8.decode_tiles(r["m"])) | extra
        assert all(us > 0 for us in r["decode_tiles_us"].values())
    assert doc["acceptance"]["block"]["min_speedup_prefill_8k"] is None  # no 8K row in the smoke run
    assert (tmp_path / "fp8-weights-cpu.png").stat().st_size > 0


def test_bench_fp8_tma_rows(tmp_path: Path) -> None:
    """--tma: per row the default GEMM, bf16 and every TMA tile that fits the batch and format (checked
    against the twin before timing); a shape TMA cannot load (smoke down_proj's K = 200) has none."""
    assert bench_fp8.main(["--smoke", "--tma", "--ms", "40", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "fp8-tma-cpu.json").read_text())["rows"]
    want_rows = [("qkv", "channel"), ("qkv", "block"), ("down", "channel"), ("down", "block")]
    assert [(r["name"], r["format"]) for r in rows] == want_rows
    for r in rows:
        assert r["kind"] == "tma" and r["triton_us"] > 0 and r["bf16_us"] > 0
        block = None if r["format"] == "channel" else 128
        want = set(fp8_tma.tma_tiles(40, block)) if r["k"] % 16 == 0 else set()
        assert set(r["tma_tiles_us"]) == want and all(us > 0 for us in r["tma_tiles_us"].values())
        assert ("tma_best" in r) == bool(want)
    assert all(t.block_m <= 64 for t in fp8_tma.tma_tiles(40, None).values())
    assert all(t.block_n <= 128 for t in fp8_tma.tma_tiles(200, 128).values())


def test_gpu_tag_names_result_files_by_the_card() -> None:
    from benchmarks import timing

    assert timing.gpu_tag("NVIDIA H200") == "h200" and timing.gpu_tag("NVIDIA H100 80GB HBM3") == "h100"
    assert timing.gpu_tag("NVIDIA A100-SXM4-80GB") == "a100-sxm4-80gb"
    if timing.DEV == "cpu":
        assert timing.gpu_tag() == "cpu"


def test_eval_fp8_weights_smoke(tmp_path: Path) -> None:
    from benchmarks import eval_fp8_weights

    assert eval_fp8_weights.main(["--smoke", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "fp8-weights-accuracy.json").read_text())
    assert doc["windows"] == 2 and doc["tokens"] == 62 and doc["weight_gib"] < doc["baseline_weight_gib"]
    assert 0 <= doc["kl"] < 0.1 and 0 <= doc["top1"] <= 1 and doc["kl_ci"][0] <= doc["kl"] <= doc["kl_ci"][1]


def test_eval_fp8_weights_breakdown_rows(tmp_path: Path) -> None:
    from benchmarks import eval_fp8_weights as ev

    assert ev.main(["--smoke", "--breakdown", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "fp8-weights-accuracy.json").read_text())
    rows = {r["row"]: r for r in doc["breakdown"]}
    assert list(rows) == [v.label for v in ev.BREAKDOWN] + [ev.BF16_ROW]  # the smoke model is fp32 on CPU
    assert rows["qkv_proj only"]["modules"] == ["self_attn.qkv_proj"]
    assert rows["weights only"]["fp8"] == "weights" and rows["activations only"]["fp8"] == "activations"
    for r in doc["breakdown"]:
        assert 0 <= r["kl"] < 0.1 and r["kl_ci"][0] <= r["kl"] <= r["kl_ci"][1] and 0 <= r["top1"] <= 1


@pytest.mark.parametrize("scales", ["CHANNEL", "BLOCK128"])
def test_fake_fp8_linear_is_the_served_rounding(scales: str) -> None:
    """The breakdown's fake quantization, weights and activations both on, equals the FP8 layer's CPU
    reference: its rows measure the served scheme, not a look-alike."""
    import torch

    from benchmarks import eval_fp8_weights as ev
    from nibblekv.formats.fp8_weights import quantize_weight_block, quantize_weight_channel
    from nibblekv.kernels.fp8.reference import fp8_linear_ref

    gen = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(200, 96, bias=True)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(96, 200, generator=gen) * 0.05)
        lin.bias.copy_(torch.randn(96, generator=gen))
    x = torch.randn(3, 5, 200, generator=gen) * torch.logspace(-2, 1, 200)  # uneven channels, as in LLMs
    variant = ev.Variant("all", True, True, ev.Scales[scales])
    block = ev.BLOCK if variant.scales is ev.Scales.BLOCK128 else None
    wq, ws = (
        quantize_weight_channel(lin.weight) if block is None else quantize_weight_block(lin.weight, block)
    )
    want = fp8_linear_ref(x, wq, ws, block, lin.bias.detach())
    got = ev.FakeFp8Linear(lin, variant)(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got - lin(x)).abs().max() > 1e-3  # and it does round


def test_ncu_summary_labels_each_kernel(tmp_path: Path) -> None:
    """tools/ncu_summary.py (the ncu tools' --summarize): each kernel of ncu's raw CSV gets the label printed
    before it (a split-K sum kernel its GEMM's), its DRAM rate (MB / us = TB/s) and its stalls' shares."""
    from benchmarks.tools import ncu_summary

    stall = ncu_summary.STALL
    hdr = ["ID", "Kernel Name", "Grid Size", "Block Size", "gpu__time_duration.sum", "dram__bytes_read.sum",
           "sm__cycles_active.avg", "sm__cycles_elapsed.avg", "launch__registers_per_thread",
           "launch__waves_per_multiprocessor", stall + "barrier", stall + "wait",
           stall + "barrier_not_issued"]  # fmt: skip
    grid, cta = "(96, 4, 1)", "(128, 1, 1)"
    # ncu's units row: the time and byte units change with their size (ms / Gbyte for the last kernel)
    rows = [hdr, ["", "", "", "", "us", "Mbyte"] + [""] * 7,
            ["0", "gemm", grid, cta, "12.5", "25", "75", "100", "40", "0.7", "9", "30", "99"],
            ["1", "sum", grid, cta, "4", "1", "10", "100", "38", "0.1", "1", "2", "99"],
            ["2", "nvjet", grid, cta, "20", "30", "50", "100", "168", "0.4", "5,000", "1", "0"]]  # fmt: skip
    big = ["3", "decode", grid, cta, "1.5", "3.6", "98", "100", "160", "1.1", "0", "7", "0"]
    (tmp_path / "raw.csv").write_text("\n".join(",".join(f'"{v}"' for v in r) for r in rows) + "\n")
    units2 = ["", "", "", "", "ms", "Gbyte"] + [""] * 7
    (tmp_path / "raw2.csv").write_text("\n".join(",".join(f'"{v}"' for v in r) for r in (hdr, units2, big)))
    # with or without ncu's " - ID:" (ncu -k prints none): labels go by profiling order
    log = ["profiling qkv m=16 channel: grid G", '==PROF== Profiling "gemm" - 0: 0%',
           '==PROF== Profiling "sum" - 1:', "profiling qkv m=16 channel: cublaslt",
           '==PROF== Profiling "nvjet_sm90...": 0%....100% - 38 passes']  # fmt: skip
    (tmp_path / "log").write_text("\n".join(log) + "\n")
    got = ncu_summary.kernel_rows(str(tmp_path / "raw.csv"), str(tmp_path / "log"))
    assert [(k["label"], k["kernel"]) for k in got] == [
        ("qkv m=16 channel: grid G", "gemm"), ("qkv m=16 channel: grid G", "sum"),
        ("qkv m=16 channel: cublaslt", "nvjet"),
    ]  # fmt: skip
    assert got[0]["dram_tb_s"] == 2.0 and got[0]["sm_active_frac"] == 0.75
    assert got[0]["stall_share"] == {"wait": 0.769, "barrier": 0.231}  # "..._not_issued" columns left out
    assert got[2]["stall_share"] == {"barrier": 1.0, "wait": 0.0}
    (tmp_path / "log2").write_text('profiling nvfp4 8x32768\n==PROF== Profiling "decode": 0%\n')
    (one,) = ncu_summary.kernel_rows(str(tmp_path / "raw2.csv"), str(tmp_path / "log2"))
    assert one["label"] == "nvfp4 8x32768" and one["us"] == 1500.0 and one["dram_tb_s"] == 2.4
