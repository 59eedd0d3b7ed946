"""``nibblekv calibrate``: per-layer K/V global scales (amax / (6 * 448)) as a ``--kv-scales-path`` JSON."""

from __future__ import annotations

import argparse

from nibblekv.eval.common import ScaleSource, add_model_args, load, progress


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    doc = __doc__.splitlines()[0]
    p = subparsers.add_parser("calibrate", help=doc, description=doc)
    add_model_args(p)
    p.add_argument("--out", required=True, help="JSON to write (load it with --kv-scales-path)")
    p.add_argument(
        "--hadamard",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="scales for Hadamard-rotated K/V, as the nvfp4 default stores them (--no-hadamard for "
        "--no-kv-hadamard)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    model, tokenizer = load(args)
    scales = ScaleSource(model, tokenizer, args).get(args.hadamard)
    scales.save(args.out)
    k, v = scales.k, scales.v
    progress(
        f"wrote {args.out} ({scales.source}; K {min(k):.3g}..{max(k):.3g}, V {min(v):.3g}..{max(v):.3g})"
    )
    return 0
