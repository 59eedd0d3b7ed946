"""``nibblekv calibrate``: per-layer K/V global scales (amax / (6 * 448)) as a ``--kv-scales-path`` JSON."""

from __future__ import annotations

import argparse

from nibblekv.cli_style import add_command, add_switch
from nibblekv.eval.common import ScaleSource, add_model_args, checked_data_dir, load, progress

HELP = "compute per-layer K/V scales for --kv-scales-path"
DESCRIPTION = (
    "Compute per-layer global K/V scales (amax / (6 * 448)) on calibration text and write them as JSON for "
    "'nibblekv serve --kv-scales-path' (by default on northanger_abbey.txt of the packaged Austen excerpts)."
)
EPILOG = """example:
  nibblekv calibrate --out scales.json
  nibblekv serve --kv-cache-dtype nvfp4 --kv-scales-path scales.json"""


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(subparsers, "calibrate", run, HELP, DESCRIPTION, EPILOG)
    add_model_args(p)
    p.add_argument("--out", required=True, help="JSON to write (load it with --kv-scales-path)")
    add_switch(p, "--hadamard", True, "scales for Hadamard-rotated K/V, as the nvfp4 default stores them "
               "(--no-hadamard for --no-kv-hadamard)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    checked_data_dir(args)
    model, tokenizer = load(args)
    scales = ScaleSource(model, tokenizer, args).get(args.hadamard)
    scales.save(args.out)
    k, v = scales.k, scales.v
    progress(
        f"wrote {args.out} ({scales.source}; K {min(k):.3g}..{max(k):.3g}, V {min(v):.3g}..{max(v):.3g})"
    )
    return 0
