"""Accuracy of ``--quantization fp8`` weights against the same model's unquantized weights (issue 48).

Usage::

    PYTHONPATH=. python benchmarks/eval_fp8_weights.py [--model PATH] [--out DIR]   # bundled SmolLM2
    PYTHONPATH=. python benchmarks/eval_fp8_weights.py --smoke --out DIR           # tiny dummy model, seconds

Scores every position of fixed windows of the packaged evaluation texts (``nibblekv.eval.data``, the KV eval's
prefill windows) with both models, full causal attention, KV in the model dtype: KL(unquantized || FP8),
top-1 agreement and the perplexity change, with 95% bootstrap intervals over windows
(``nibblekv.eval.metrics``). Writes ``DIR/fp8-weights-accuracy.json``; the acceptance asks top-1 >= 0.95.

``--breakdown`` adds rows that say where the loss comes from, each scored against the same unquantized
baseline on the same windows (fake quantization: the FP8 codes and scales of ``nibblekv.formats.fp8_weights``,
dequantized, fp32 matmul): FP8 weights alone, FP8 activations alone, each projection kind alone (qkv / o /
gate_up / down, weights and activations), the block-checkpoint scheme (128x128 weight blocks, 1x128
activation groups), and for scale the same model in bf16 (weights and compute) against the baseline.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root
from nibblekv.eval.data import eval_texts, resolve_data_dir, token_windows  # noqa: E402
from nibblekv.eval.metrics import WindowAccumulator, compare, summarize  # noqa: E402
from nibblekv.formats.fp8_weights import (  # noqa: E402
    dequantize_act_groups,
    dequantize_weight,
    quantize_act_groups,
    quantize_weight_block,
    quantize_weight_channel,
)
from nibblekv.model import CausalLM, DenseAttention, load_model  # noqa: E402
from nibblekv.model.fp8 import FP8_MODULES, QuantMethod, weight_bytes  # noqa: E402

SMOKE_CONFIG = {
    "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 320,
    "max_position_embeddings": 256, "eos_token_id": 257,
}  # fmt: skip


class Scales(Enum):
    """Where the FP8 scales sit, as the two checkpoint families ship them."""

    CHANNEL = "per-channel weights, per-token activations"  # --quantization fp8, -FP8-dynamic checkpoints
    BLOCK128 = "128x128 weight blocks, 1x128 activation groups"  # Qwen3-*-FP8 / DeepSeek checkpoints


@dataclass(frozen=True)
class Variant:
    """One breakdown row: which parts of which projections are FP8 (the rest keep the model dtype)."""

    label: str
    weights: bool
    activations: bool
    scales: Scales = Scales.CHANNEL
    modules: tuple[str, ...] = FP8_MODULES


BREAKDOWN: tuple[Variant, ...] = (
    Variant("weights only", True, False),
    Variant("activations only", False, True),
    *(Variant(f"{m.rpartition('.')[2]} only", True, True, modules=(m,)) for m in FP8_MODULES),
    Variant("block scales (weights and activations)", True, True, Scales.BLOCK128),
)
BF16_ROW = "bf16 model (weights and compute) vs the fp32 baseline"
BLOCK = 128


class FakeFp8Linear(nn.Module):
    """``linear``'s product with FP8-rounded weights and/or activations (fp32 matmul, output in ``x``'s
    dtype): the rounding of :class:`nibblekv.model.fp8.Fp8Linear` without its kernels, per part."""

    def __init__(self, linear: nn.Module, v: Variant) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        if v.weights and v.scales is Scales.CHANNEL:
            w = dequantize_weight(*quantize_weight_channel(w), None)
        elif v.weights:
            w = dequantize_weight(*quantize_weight_block(w, BLOCK), BLOCK)
        self.w = w
        bias = getattr(linear, "bias", None)
        self.b = None if bias is None else bias.detach().float()
        self.group = BLOCK if v.scales is Scales.BLOCK128 else None
        self.activations = v.activations

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).float()
        if self.activations:
            group = self.group or x2.shape[1]
            x2 = dequantize_act_groups(*quantize_act_groups(x2, group), group)
        y = x2 @ self.w.t()
        if self.b is not None:
            y = y + self.b
        return y.to(x.dtype).reshape(*x.shape[:-1], self.w.shape[0])


def _slots(model: CausalLM, modules: tuple[str, ...]) -> list[tuple[nn.Module, str]]:
    out = []
    for layer in model.model.layers:
        for path in modules:
            parent, _, attr = path.rpartition(".")
            out.append((layer.get_submodule(parent), attr))
    return out


@contextmanager
def _swapped(model: CausalLM, swaps: list[tuple[nn.Module, str, nn.Module]]) -> Iterator[None]:
    """``model`` with each ``(parent, attr, module)`` of ``swaps`` in place, restored on exit."""
    old = [(parent, attr, getattr(parent, attr)) for parent, attr, _ in swaps]
    try:
        for parent, attr, module in swaps:
            setattr(parent, attr, module)
        yield
    finally:
        for parent, attr, module in old:
            setattr(parent, attr, module)


def breakdown(ref: CausalLM, windows: torch.Tensor) -> list[dict[str, Any]]:
    """:data:`BREAKDOWN`'s rows and :data:`BF16_ROW`, each against ``ref`` on ``windows``."""
    swaps = {
        v.label: [(p, a, FakeFp8Linear(getattr(p, a), v)) for p, a in _slots(ref, v.modules)]
        for v in BREAKDOWN
    }
    bf16 = copy.deepcopy(ref).to(torch.bfloat16) if ref.dtype == torch.float32 else None
    labels = [v.label for v in BREAKDOWN] + ([BF16_ROW] if bf16 is not None else [])
    accs = {label: WindowAccumulator(windows.shape[0]) for label in labels}
    base = WindowAccumulator(windows.shape[0])
    for i, window in enumerate(windows):
        targets = window[1:].to(ref.device)
        lr = torch.log_softmax(_logits(ref, window)[:-1].float(), dim=-1)
        base.add(i, compare(lr, lr, targets))
        for v in BREAKDOWN:
            with _swapped(ref, swaps[v.label]):
                accs[v.label].add(i, compare(lr, _logits(ref, window)[:-1], targets))
        if bf16 is not None:
            accs[BF16_ROW].add(i, compare(lr, _logits(bf16, window)[:-1], targets))
    rows = []
    for v in BREAKDOWN:
        parts = " and ".join(p for p, on in (("weights", v.weights), ("activations", v.activations)) if on)
        rows.append({"row": v.label, "fp8": parts, "scales": v.scales.value,
                     "modules": list(v.modules), **summarize(accs[v.label], base)})  # fmt: skip
    if bf16 is not None:
        rows.append({"row": BF16_ROW, "fp8": "none", **summarize(accs[BF16_ROW], base)})
    return rows


@torch.no_grad()
def _logits(model: CausalLM, window: torch.Tensor) -> torch.Tensor:
    n = window.numel()
    ids = window.to(model.device)
    return model.compute_logits(model(ids, torch.arange(n, device=model.device), DenseAttention.single(n)))


def evaluate(ref: CausalLM, fp8: CausalLM, windows: torch.Tensor) -> dict[str, Any]:
    """KL / top-1 / perplexity of ``fp8`` against ``ref`` over ``windows [W, L]`` (next-token positions)."""
    acc, base = WindowAccumulator(windows.shape[0]), WindowAccumulator(windows.shape[0])
    for i, window in enumerate(windows):
        targets = window[1:].to(ref.device)
        lr = torch.log_softmax(_logits(ref, window)[:-1].float(), dim=-1)
        acc.add(i, compare(lr, _logits(fp8, window)[:-1], targets))
        base.add(i, compare(lr, lr, targets))
    return summarize(acc, base)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF / HF folder (default: the bundled SmolLM2-135M)")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default=None, help="default: bf16 on CUDA")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--window-tokens", type=int, default=512)
    ap.add_argument("--data-dir", default=None, help="folder of *.txt (default: the packaged texts)")
    ap.add_argument("--smoke", action="store_true", help="a tiny random model, 2 windows of 32 tokens")
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="also score weights / activations / each projection kind / block scales alone, and the "
        "model in bf16 (about 10x the run time)",
    )
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    args = ap.parse_args(argv)
    model, fmt = args.model, args.load_format
    if args.smoke:
        path = Path(tempfile.mkdtemp()) / "config.json"
        path.write_text(json.dumps(SMOKE_CONFIG))
        model, fmt, args.windows, args.window_tokens = str(path), "dummy", 2, 32
    dtype = getattr(torch, args.dtype) if args.dtype else None
    kw: dict[str, Any] = dict(load_format=fmt, dtype=dtype, device=args.device)
    ref, tokenizer = load_model(model, **kw)
    fp8, _ = load_model(model, quantization=QuantMethod.FP8, **kw)
    texts = eval_texts(resolve_data_dir(args.data_dir))
    windows = token_windows(tokenizer, texts, args.windows, args.window_tokens)
    res = evaluate(ref, fp8, windows)
    doc = {
        "model": model or "SmolLM2-135M-Instruct (bundled)", "baseline": f"unquantized {ref.dtype}",
        "weights": "fp8 (--quantization fp8: per-channel weights, per-token activations)",
        "device": args.device, "mode": "prefill (full causal attention, KV in the model dtype)",
        "weight_gib": weight_bytes(fp8) / (1 << 30), "baseline_weight_gib": weight_bytes(ref) / (1 << 30),
        "window_tokens": args.window_tokens, "smoke": args.smoke,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **res, "top1_ok": res["top1"] >= 0.95,
    }  # fmt: skip
    if args.breakdown:
        doc["breakdown"] = breakdown(ref, windows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fp8-weights-accuracy.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
