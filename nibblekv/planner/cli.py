"""``nibblekv plan``: how many tokens and full-context sessions of KV cache fit on one GPU."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from nibblekv.cli_style import add_command
from nibblekv.formats import KVDtype
from nibblekv.model.hybrid_config import SSM_DTYPE_BYTES
from nibblekv.model.presets import PRESETS
from nibblekv.planner.engine_fit import EngineOptions
from nibblekv.planner.plan import GPUS, WEIGHT_BYTES_PER_PARAM, MemoryRule, Plan, PlanError, plan_for

PROG = "nibblekv plan"
# the EngineOptions fields that are flags of the same name (engine flags, same defaults): their help
ENGINE_FLAGS: dict[str, str] = {
    "page_size": "engine: tokens per KV page",
    "kv_recent_window": "engine: newest tokens per request kept in bf16 (fp8/nvfp4), paid from the KV budget",
    "chunked_prefill_size": "engine: prefill chunk (sets the bf16 prefill window the engine reserves)",
}
HELP = "how much KV cache (tokens, full-context sessions) fits on one GPU, per KV dtype"
DESCRIPTION = (
    "How many tokens and full-context sessions of KV cache fit on one GPU for a model, per KV dtype (bf16, "
    "fp8_e4m3, nvfp4), after the weights and a runtime reserve. No GPU needed."
)
EPILOG = """examples:
  nibblekv plan --model llama-3.1-8b --gpu H200 --context 128k
  nibblekv plan --model /models/Qwen3-8B/config.json --gpu 80 --context 32768 --json"""


def parse_context(text: str) -> int:
    """``--context`` value: an integer, or with a ``k`` / ``m`` suffix for x1024 / x1024**2 (``128k`` = 131072,
    ``1m`` = 1048576)."""
    raw = text.strip().lower()
    scale = {"k": 1024, "m": 1024 * 1024}.get(raw[-1:], 1)
    try:
        return int(raw[:-1] if scale > 1 else raw) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a token count: {text!r}") from None


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``plan`` subcommand."""
    p = add_command(subparsers, "plan", run, HELP, DESCRIPTION, EPILOG)
    p.add_argument(
        "--model",
        required=True,
        help=f"config.json path, Hugging Face Hub id (org/name: its config.json is fetched) or built-in: "
        f"{', '.join(sorted(PRESETS))}",
    )
    p.add_argument("--gpu", required=True, help=f"{', '.join(GPUS)}, or the reported memory in GiB")
    p.add_argument(
        "--weights-dtype",
        choices=tuple(WEIGHT_BYTES_PER_PARAM),
        default=None,
        help="weight dtype (default bf16): published checkpoint size if known, else estimated",
    )
    p.add_argument(
        "--weights-gib", type=float, default=None, help="weights footprint in GiB (overrides the dtype)"
    )
    p.add_argument(
        "--context", type=parse_context, required=True, help="tokens per session, e.g. 8192, 128k or 1m"
    )
    p.add_argument("--mem-fraction", type=float, default=0.9, help="share of reported memory usable")
    p.add_argument("--reserve-gib", type=float, default=3.0, help="GiB kept for activations and runtime")
    e = EngineOptions()
    for name, help_text in ENGINE_FLAGS.items():
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(e, name), help=help_text)
    p.add_argument(
        "--mamba-ssm-dtype", choices=tuple(SSM_DTYPE_BYTES), default=None,
        help="engine: hybrid models' recurrent-state dtype (default: the config's mamba_ssm_dtype, else "
        "float32)",
    )  # fmt: skip
    p.add_argument(
        "--max-mamba-cache-size", type=int, default=None,
        help="engine: hybrid models' state slots, running requests' plus prefix-cache snapshots (default: "
        "twice the running requests)",
    )  # fmt: skip
    p.add_argument(
        "--disable-radix-cache", action="store_true", help="engine: no prefix cache (hybrid: no snapshots)"
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def _ratio(num: float, den: float) -> str:
    """``num/den`` as ``1.75x``, or ``n/a`` when the denominator is zero."""
    return f"{num / den:.4g}x" if den else "n/a"


def _comparison(plan: Plan) -> str | None:
    """The nvfp4-vs-fp8 line, None if either is unsupported for this model."""
    fp4, fp8 = plan.kv_plan(KVDtype.NVFP4), plan.kv_plan(KVDtype.FP8)
    if fp4 is None or fp8 is None:
        return None
    return (
        f"nvfp4 vs fp8_e4m3: {_ratio(fp4.bytes_per_token, fp8.bytes_per_token)} bytes per token, "
        f"{_ratio(fp4.sessions, fp8.sessions)} sessions ({fp4.sessions} vs {fp8.sessions})"
    )


def _header(plan: Plan) -> list[str]:
    """Model geometry and the memory rule, as applied."""
    m, w, r = plan.model, plan.weights, plan.rule
    weights_label = w.source if w.dtype is None else f"{w.dtype}, {w.source}"
    geometry = f"{m.num_kv_layers} layers x {m.num_kv_heads} KV heads x head_dim {m.head_dim}"
    if m.hybrid is not None:  # only the full-attention layers hold KV; each request also holds its states
        geometry = (f"{m.num_kv_layers} of {m.num_layers} layers (full attention; "
                    f"{m.state_bytes_per_request / 2**20:,.1f} MiB linear-attention state per request) x "
                    f"{m.num_kv_heads} KV heads x head_dim {m.head_dim}")  # fmt: skip
    usable = f"{plan.gpu.reported_gib:.2f} GiB reported x {r.mem_fraction:g} - {r.reserve_gib:g} GiB reserve"
    weights = f"{w.gib:.2f} GiB weights ({weights_label})"
    return [
        f"{m.name} on {plan.gpu.name}, {plan.context:,}-token sessions",
        f"  model   {geometry} = {m.values_per_token:,} K+V values per token",
        f"  memory  {usable} - {weights} = {plan.kv_budget_gib:.2f} GiB for KV",
    ]


def _rows(plan: Plan) -> list[str]:
    """One row per KV dtype, then the dtypes this model cannot use."""
    rows = [f"  {'KV dtype':<10}{'bytes/token':>13}{'GiB/session':>13}{'tokens':>14}{'sessions':>10}"]
    for p in plan.kv:
        sizes = f"{p.bytes_per_token:>13,}{p.gib_per_session:>13.6g}"
        rows.append(f"  {p.dtype.value:<10}{sizes}{p.tokens:>14,}{p.sessions:>10,}")
    rows += [f"  {name:<10}unsupported: {why}" for name, why in plan.unsupported]
    if plan.requests:
        e = plan.engine
        counts = ", ".join(f"{name} {n:,}" for name, n in plan.requests)
        what = f"bf16 tail W={e.kv_recent_window}, sink and prefill pages, page table, page {e.page_size}"
        if plan.model.hybrid is not None:
            what += ", a state slot each"
            if not e.disable_radix_cache:
                slots = (
                    "as many" if e.max_mamba_cache_size is None else f"the rest of {e.max_mamba_cache_size}"
                )
                what += f", {slots} for prefix-cache snapshots"
        rows += ["", f"engine resident requests ({what}): {counts}"]
    return rows


def format_table(plan: Plan) -> str:
    """The human-readable plan."""
    lines = [*_header(plan), "", *_rows(plan)]
    comparison = _comparison(plan)
    if comparison:
        lines += ["", comparison]
    if plan.kv_budget_gib <= 0:
        lines.append(f"weights and reserve exceed usable memory by {-plan.kv_budget_gib:.2f} GiB: no KV fits")
    return "\n".join(lines)


def _warnings(plan: Plan) -> list[str]:
    """Non-fatal remarks about the inputs."""
    limit = plan.model.max_position_embeddings
    if limit is not None and plan.context > limit:
        return [f"context {plan.context} exceeds the model's max_position_embeddings {limit}"]
    return []


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Execute ``nibblekv plan``; 0 on success, 2 on bad input (one line on stderr)."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        plan = plan_for(
            args.model,
            args.gpu,
            args.context,
            weights_dtype=args.weights_dtype,
            weights_gib=args.weights_gib,
            rule=MemoryRule(args.mem_fraction, args.reserve_gib),
            engine=EngineOptions(
                **{name: getattr(args, name) for name in ENGINE_FLAGS},
                disable_radix_cache=args.disable_radix_cache,
                max_mamba_cache_size=args.max_mamba_cache_size,
            ),
            mamba_ssm_dtype=args.mamba_ssm_dtype,
        )
    except PlanError as exc:
        print(f"{PROG}: error: {exc}", file=err)
        return 2
    for warning in _warnings(plan):
        print(f"{PROG}: warning: {warning}", file=err)
    print(json.dumps(plan.to_json(), indent=2) if args.json else format_table(plan), file=out)
    return 0
