"""Accuracy of ``--quantization fp8`` weights against the same model's unquantized weights (issue 48).

Usage::

    PYTHONPATH=. python benchmarks/eval_fp8_weights.py [--model PATH] [--out DIR]   # bundled SmolLM2
    PYTHONPATH=. python benchmarks/eval_fp8_weights.py --smoke --out DIR           # tiny dummy model, seconds

Scores every position of fixed windows of the packaged evaluation texts (``nibblekv.eval.data``, the KV eval's
prefill windows) with both models, full causal attention, KV in the model dtype: KL(unquantized || FP8),
top-1 agreement and the perplexity change, with 95% bootstrap intervals over windows
(``nibblekv.eval.metrics``). Writes ``DIR/fp8-weights-accuracy.json``; the acceptance asks top-1 >= 0.95.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root
from nibblekv.eval.data import eval_texts, resolve_data_dir, token_windows  # noqa: E402
from nibblekv.eval.metrics import WindowAccumulator, compare, summarize  # noqa: E402
from nibblekv.model import CausalLM, DenseAttention, load_model  # noqa: E402
from nibblekv.model.fp8 import QuantMethod, weight_bytes  # noqa: E402

SMOKE_CONFIG = {
    "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 320,
    "max_position_embeddings": 256, "eos_token_id": 257,
}  # fmt: skip


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
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fp8-weights-accuracy.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
