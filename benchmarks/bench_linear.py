"""Gated DeltaNet decode: one linear-attention layer's conv + gated-delta-rule step over a state pool, at
Qwen3.5-27B's linear heads (16 key heads, 48 value heads of 128; conv 10240 channels, width 4).

Usage (on the GPU machine; fla-core from the carried wheel for the ``gather_fla`` rows)::

    PYTHONPATH=.:/tmp/site python benchmarks/bench_linear.py --out DIR
    TRITON_INTERPRET=1 python benchmarks/bench_linear.py --smoke --out DIR   # CPU: tiny heads, seconds

Variants, each checked against the twins of ``kernels.linear.reference`` first and timed as a CUDA-graph
replay with L2 emptied before every call:

* ``in_place``: ``kernels.linear``'s conv and rule kernels, reading and writing each request's pool rows once;
* ``in_place_bf16``: the same on a bf16 recurrent state (``--mamba-ssm-dtype bfloat16``);
* ``gather_fla``: the path they replaced -- gather the requests' states out of the pool (``index_select``),
  torch's conv + SiLU, the decay and beta as torch ops, fla-core's ``fused_recurrent_gated_delta_rule``,
  and scatter the new states back (``index_copy_``).

``state_bytes`` is the floor: every request's conv and recurrent state read and written once; ``frac`` is
that over the time, as a fraction of the run's read ceiling. Writes ``DIR/linear-decode-h200.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root, for `benchmarks.*`
from benchmarks.bench_long_context import commit_id  # noqa: E402
from benchmarks.timing import DEV, bench_graph, read_ceiling  # noqa: E402
from nibblekv.kernels.linear.decode import conv_decode_triton, gated_delta_rule_decode_triton  # noqa: E402
from nibblekv.kernels.linear.reference import conv_decode_ref, gated_delta_rule_decode_ref  # noqa: E402
from nibblekv.kernels.testing import rel_rms  # noqa: E402

# (key heads, value heads, head dim, conv width): Qwen3.5-27B's linear-attention layers
HEADS = (16, 48, 128, 4)
HEADS_SMOKE = (2, 4, 16, 4)
BATCHES = (1, 8, 32, 64, 128, 256)
BATCHES_SMOKE = (1, 3)
# rel. RMS of a bf16 output against the float32-summing twin (the interpreter's float32 -> bf16 truncation
# doubles it on CPU: 0.018 at the smoke shapes)
TOLERANCE = 3e-2


class Layer:
    """One layer's inputs for ``n`` requests on a pool of ``n + 1`` slots (the last one unused)."""

    def __init__(self, n: int, heads: tuple[int, int, int, int], seed: int = 0) -> None:
        h, hv, d, width = heads
        self.h, self.hv, self.d = h, hv, d
        gen = torch.Generator(device=DEV).manual_seed(seed)
        c = 2 * h * d + hv * d
        bf16: dict[str, Any] = {"dtype": torch.bfloat16, "device": DEV}
        self.x = torch.randn(n, c, generator=gen, device=DEV).to(torch.bfloat16)
        self.weight = (torch.randn(c, width, generator=gen, device=DEV) * 0.5).to(torch.bfloat16)
        self.a, self.b = (torch.randn(n, hv, generator=gen, device=DEV).to(torch.bfloat16) for _ in range(2))
        self.A_log = torch.rand(hv, **bf16)
        self.dt_bias = torch.ones(hv, **bf16)
        self.conv = torch.randn(n + 1, c, width - 1, generator=gen, device=DEV).to(torch.bfloat16)
        self.rec = torch.randn(n + 1, hv, d, d, generator=gen, device=DEV) * 0.05
        self.slots = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).to(DEV)
        self.n, self.c, self.width = n, c, width

    def state_bytes(self, ssm: torch.dtype) -> int:
        """Every request's conv window and recurrent state (in ``ssm``) read and written once."""
        rec = self.hv * self.d * self.d * torch.finfo(ssm).bits // 8
        return 2 * self.n * (rec + self.c * (self.width - 1) * 2)

    def heads(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n, h, hv, d = y.shape[0], self.h, self.hv, self.d
        q, k, v = y.split([h * d, h * d, hv * d], dim=-1)
        return q.reshape(n, h, d), k.reshape(n, h, d), v.reshape(n, hv, d)

    def pools(self, ssm: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        return self.conv.clone(), self.rec.to(ssm, copy=True)


def in_place(layer: Layer, conv: torch.Tensor, rec: torch.Tensor) -> torch.Tensor:
    q, k, v = layer.heads(conv_decode_triton(layer.x, layer.weight, conv, layer.slots))
    a, b, slots = layer.a, layer.b, layer.slots
    return gated_delta_rule_decode_triton(q, k, v, a, b, layer.A_log, layer.dt_bias, rec, slots)


def reference(layer: Layer, conv: torch.Tensor, rec: torch.Tensor) -> torch.Tensor:
    q, k, v = layer.heads(conv_decode_ref(layer.x, layer.weight, conv, layer.slots))
    a, b, slots = layer.a, layer.b, layer.slots
    return gated_delta_rule_decode_ref(q, k, v, a, b, layer.A_log, layer.dt_bias, rec, slots)


def gather_fla(recurrent: Callable[..., Any]) -> Callable[[Layer, torch.Tensor, torch.Tensor], torch.Tensor]:
    """The replaced path around fla-core's ``fused_recurrent_gated_delta_rule`` (``recurrent``)."""

    def run(layer: Layer, conv: torch.Tensor, rec: torch.Tensor) -> torch.Tensor:
        full = torch.cat([conv.index_select(0, layer.slots), layer.x[:, :, None]], dim=-1)
        y = F.silu(F.conv1d(full, layer.weight[:, None, :], groups=full.shape[1])[..., 0])
        conv.index_copy_(0, layer.slots, full[..., 1:])
        q, k, v = (t.contiguous() for t in layer.heads(y))
        beta = layer.b.sigmoid()
        g = -layer.A_log.float().exp() * F.softplus(layer.a.float() + layer.dt_bias)
        o, new = recurrent(
            q[:, None], k[:, None], v[:, None], g=g[:, None].contiguous(), beta=beta[:, None].contiguous(),
            initial_state=rec.index_select(0, layer.slots), output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        rec.index_copy_(0, layer.slots, new)
        return o[:, 0]

    return run


Variant = tuple[Callable[[Layer, torch.Tensor, torch.Tensor], torch.Tensor], torch.dtype]


def variants() -> dict[str, Variant]:
    """name -> (the step, its recurrent-state dtype)."""
    out: dict[str, Variant] = {
        "in_place": (in_place, torch.float32), "in_place_bf16": (in_place, torch.bfloat16),
    }  # fmt: skip
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except ImportError:
        print("fla-core is not importable: no gather_fla rows")
    else:
        if DEV == "cuda":
            out["gather_fla"] = (gather_fla(fused_recurrent_gated_delta_rule), torch.float32)
    return out


def _rows(
    n: int, heads: tuple[int, int, int, int], fns: dict[str, Variant], tbps: float
) -> list[dict[str, Any]]:
    """Every variant at ``n`` requests: checked against the twins on a pool of its state dtype, then timed."""
    layer = Layer(n, heads)
    rows = []
    for name, (fn, ssm) in fns.items():
        conv_ref, rec_ref = layer.pools(ssm)
        want = reference(layer, conv_ref, rec_ref)
        conv, rec = layer.pools(ssm)
        got = fn(layer, conv, rec)
        err = max(rel_rms(got, want), rel_rms(rec, rec_ref), rel_rms(conv, conv_ref))
        if err > TOLERANCE:
            raise SystemExit(f"{name} at n={n}: rel. RMS {err:.3g} against the twins")
        us = bench_graph(lambda fn=fn, conv=conv, rec=rec: fn(layer, conv, rec))
        nbytes = layer.state_bytes(ssm)
        frac = nbytes / us / 1e6 / tbps
        rows.append({"n": n, "variant": name, "ssm_dtype": str(ssm).removeprefix("torch."), "us": us,
                     "state_bytes": nbytes, "frac": frac, "rel_rms": err})  # fmt: skip
        print(f"n={n:4d} {name:14s} {us:9.1f} us {nbytes / 2**20:8.1f} MiB {frac:.3f} of ceiling", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny heads and batches (CPU, interpreter)")
    args = ap.parse_args(argv)
    heads, batches = (HEADS_SMOKE, BATCHES_SMOKE) if args.smoke else (HEADS, BATCHES)
    ceiling = read_ceiling(1 << 20 if args.smoke else 4 << 30)
    tbps = max(ceiling.values())
    fns = variants()
    rows = [row for n in batches for row in _rows(n, heads, fns, tbps)]
    by = {(r["n"], r["variant"]): r["us"] for r in rows}
    speedup = {str(n): by[(n, "gather_fla")] / by[(n, "in_place")] for n in batches
               if (n, "gather_fla") in by}
    doc = {
        "commit": commit_id(), "gpu": torch.cuda.get_device_name() if DEV == "cuda" else "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "heads": dict(zip(("key_heads", "value_heads", "head_dim", "conv_width"), heads, strict=True)),
        "ceiling_tbps": ceiling, "rows": rows, "speedup_in_place_over_gather_fla": speedup,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "linear-decode-h200.json").write_text(json.dumps(doc, indent=1) + "\n")
    print("speedup in_place / gather_fla:", {k: round(v, 2) for k, v in speedup.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
