"""``nibblekv eval``: KV cache accuracy against an unquantized cache (``kv``) and the fake-quant study."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from nibblekv.cli_style import add_command, non_negative_int
from nibblekv.eval.calibrate import KVMeans, KVScales, calibrate, calibrate_means
from nibblekv.eval.common import ScaleSource, add_model_args, checked_data_dir, load, progress
from nibblekv.eval.configs import BASELINE_NAME, FULL_RUN, KVConfig, parse_config
from nibblekv.eval.data import eval_texts, token_windows
from nibblekv.eval.kv_eval import EvalSettings, LockstepEval
from nibblekv.eval.metrics import summarize
from nibblekv.eval.passkey import make_cases, run_passkey
from nibblekv.eval.report import markdown_table, passkey_summary, passkey_table, plot
from nibblekv.eval.speed import speed_table
from nibblekv.eval.study import run_study

STUDY_CONFIGS: tuple[str, ...] = (
    "bf16", "fp8_e4m3", "nvfp4_plain", "nvfp4_cal", "nvfp4_4o6", "nvfp4_had", "nvfp4_cal_4o6_had",
    "nvfp4_s4", "nvfp4_w16", "nvfp4_w32", "nvfp4_w64", "nvfp4_w128", "nvfp4_s4_w64",
    "nvfp4_w64_cal", "nvfp4_w64_4o6", "nvfp4_w64_had", "nvfp4_w64_cal_4o6_had",
)  # fmt: skip
# (help, description[, epilog]) of the subcommands
KV_TEXTS = (
    "compare KV configurations through the engine's attention path",
    (
        "Compare KV configurations through the engine's own attention path (prefill in chunks and decode), "
        "in lockstep with the unquantized baseline; writes JSON, a PNG and a table."
    ),
    "example:\n  nibblekv eval kv --configs bf16 fp8_e4m3 nvfp4 --windows 8 --out kv.json",
)
STUDY_TEXTS = (
    "fast fake-quantization study of the options (dense, one pass)",
    "A fast fake-quantization study of the nvfp4 options (dense attention, one pass).",
)
MERGE_TEXTS = (
    "join 'eval kv' outputs of one setup (e.g. modes run in parallel)",
    "Join the JSON outputs of 'nibblekv eval kv' runs of one setup into one file and plot.",
)
SPEED_TEXTS = (
    "decode-step time per configuration at a long context (GPU)",
    "Time one decode step per KV configuration at a long context (on a GPU).",
)


def _configs(args: argparse.Namespace, names: list[str], baseline: bool = True) -> list[KVConfig]:
    """Parsed configuration names (the baseline first unless ``baseline=False``); a bad name is a one-line
    error, exit 2."""
    try:
        return [parse_config(n) for n in dict.fromkeys([BASELINE_NAME, *names] if baseline else names)]
    except ValueError as exc:
        args._parser.error(str(exc))
        raise  # unreachable: parser.error exits


class SmoothingSource:
    """K/V means for mean-smoothed (``_smk`` / ``_smv``) study configurations, and global scales.

    Means come from the calibration windows ``scales`` uses (computed on first use). A calibrated
    smoothed configuration gets scales from the amax of its smoothed (and, with ``_had``, rotated)
    K/V; every other configuration gets ``scales(config)``.
    """

    def __init__(self, scales: ScaleSource) -> None:
        self.base = scales
        self.stats: KVMeans | None = None
        self._scales: dict[tuple[bool, bool, bool], KVScales] = {}

    def _stats(self) -> KVMeans:
        if self.stats is None:
            progress(f"calibrating K/V means on {self.base.args.calib_windows} windows")
            self.stats = calibrate_means(self.base.model, self.base.windows())
        return self.stats

    def means(self, config: KVConfig) -> torch.Tensor | None:
        """``[layers, 2, kv_heads, D]`` with the unsmoothed side zeroed, or None when not smoothed."""
        if not config.smoothed:
            return None
        mu = self._stats().tensor().clone()
        if not config.smooth_k:
            mu[:, 0] = 0.0
        if not config.smooth_v:
            mu[:, 1] = 0.0
        return mu

    def __call__(self, config: KVConfig) -> torch.Tensor | None:
        if not (config.calibrated and config.smoothed):
            return self.base(config)
        key = (config.hadamard, config.smooth_k, config.smooth_v)
        if key not in self._scales:
            progress(f"calibrating K/V scales of smoothed K/V for {config.name}")
            self._scales[key] = calibrate(
                self.base.model, self.base.windows(), rotate=config.hadamard, means=self.means(config)
            )
        return self._scales[key].tensor()

    def to_json(self) -> dict[str, Any]:
        """Provenance and the DC ratio ``||mean|| / rms`` per layer and KV head (K and V)."""
        if self.stats is None:
            return {}
        r = self.stats.dc_ratio()
        return {
            "num_tokens": self.stats.num_tokens,
            "dc_ratio_k": [[round(x, 4) for x in row] for row in r[..., 0].tolist()],
            "dc_ratio_v": [[round(x, 4) for x in row] for row in r[..., 1].tolist()],
            "scales": {"_".join(map(str, k)): v.to_json() for k, v in self._scales.items()},
        }


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "eval",
        help="measure KV cache accuracy against an unquantized cache",
        description="Measure how close each KV cache configuration (fp8, nvfp4 and its options) keeps the "
        "model to an unquantized cache: KL divergence, top-1 agreement and perplexity on text (by default "
        "the packaged opening chapters of four Austen novels), plus passkey retrieval.",
    )
    sub = p.add_subparsers(dest="eval_command", required=True, metavar="COMMAND")
    kv = add_command(sub, "kv", run_kv, *KV_TEXTS)
    add_model_args(kv)
    d = EvalSettings()
    kv.add_argument(
        "--configs", nargs="+", default=list(FULL_RUN), help="configuration names, e.g. bf16 fp8_e4m3 nvfp4"
    )
    kv.add_argument("--windows", type=int, default=d.windows, help="text windows scored per configuration")
    kv.add_argument("--window-tokens", type=int, default=d.window_tokens, help="tokens per window")
    kv.add_argument(
        "--prefill-chunk", type=int, default=d.prefill_chunk, help="chunked-prefill size in prefill mode"
    )
    kv.add_argument(
        "--decode-context", type=int, default=d.decode_context, help="decode mode: tokens prefilled first"
    )
    kv.add_argument(
        "--decode-tokens", type=int, default=d.decode_tokens, help="decode mode: tokens scored step by step"
    )
    kv.add_argument("--batch", type=int, default=d.batch, help="windows per batch of requests")
    kv.add_argument(
        "--modes",
        nargs="*",
        default=["prefill", "decode"],
        choices=("prefill", "decode"),
        help="score the windows through chunked prefill, through decode steps, or both",
    )
    kv.add_argument(
        "--passkey-lengths",
        type=int,
        nargs="*",
        default=[1024, 2048, 4096, 8192],
        help="prompt lengths of the passkey retrieval test (none given: skip it)",
    )
    kv.add_argument(
        "--passkey-depths",
        type=float,
        nargs="+",
        default=[0.1, 0.3, 0.5, 0.7, 0.9],
        help="where the passkey sits in the prompt (0: start, 1: end)",
    )
    kv.add_argument(
        "--passkey-configs",
        nargs="+",
        default=["bf16", "fp8_e4m3", "nvfp4", "nvfp4_plain"],
        help="configurations the passkey test runs",
    )
    kv.add_argument("--passkey-chunk", type=int, default=2048, help="prefill chunk (the engine's default)")
    kv.add_argument("--kv-scales-path", default=None, help="scales for *_cal configs (default: calibrate)")
    kv.add_argument("--out", default="kv-accuracy.json", help="JSON to write")
    kv.add_argument("--plot", default=None, help="PNG path (default: --out with .png)")
    st = add_command(sub, "study", run_study_cmd, *STUDY_TEXTS)
    add_model_args(st)
    st.add_argument("--configs", nargs="+", default=list(STUDY_CONFIGS), help="configuration names")
    st.add_argument("--windows", type=int, default=8, help="text windows scored per configuration")
    st.add_argument("--window-tokens", type=int, default=512, help="tokens per window")
    st.add_argument("--batch", type=int, default=2, help="windows per forward pass")
    st.add_argument(
        "--chunk",
        type=non_negative_int,
        default=0,
        help="model chunked prefill in chunks of this size (0: decode)",
    )
    st.add_argument("--kv-scales-path", default=None, help="scales for *_cal configs (default: calibrate)")
    st.add_argument("--out", default="kv-accuracy.study.json", help="JSON to write")
    mg = add_command(sub, "merge", run_merge_cmd, *MERGE_TEXTS)
    mg.add_argument("parts", nargs="+", help="JSON files written by 'nibblekv eval kv'")
    mg.add_argument("--out", required=True, help="JSON to write (a PNG beside it)")
    sp = add_command(sub, "speed", run_speed_cmd, *SPEED_TEXTS)
    add_model_args(sp)
    sp.add_argument(
        "--configs",
        nargs="+",
        default=["nvfp4_plain", "nvfp4", "nvfp4_w128", "nvfp4_had", "nvfp4_w64_had"],
        help="configuration names",
    )
    sp.add_argument("--batch", type=int, default=8, help="requests decoded together")
    sp.add_argument("--context", type=int, default=32768, help="tokens of context per request")
    sp.add_argument("--steps", type=int, default=20, help="decode steps timed")
    sp.add_argument("--out", default=None, help="JSON to write (default: print only)")


def _header(
    args: argparse.Namespace, model: Any, configs: list[KVConfig], scales: ScaleSource
) -> dict[str, Any]:
    return {
        "model": str(args.model or "SmolLM2-135M-Instruct (bundled GGUF, Q4_1)"),
        "device": str(model.device),
        "baseline": BASELINE_NAME,
        "baseline_dtype": str(model.dtype).removeprefix("torch."),
        "baseline_note": "bf16 = an unquantized cache in the model's dtype (--kv-cache-dtype auto)",
        "configs": {c.name: asdict(c) for c in configs},
        "scales": {("hadamard" if k else "plain"): v.to_json() for k, v in scales._cache.items()},
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def run_kv(args: argparse.Namespace) -> int:
    t0 = time.time()
    try:
        settings = EvalSettings(
            args.windows,
            args.window_tokens,
            args.prefill_chunk,
            args.decode_context,
            args.decode_tokens,
            args.batch,
        )
    except ValueError as exc:
        args._parser.error(str(exc))
    data_dir = checked_data_dir(args)
    configs = _configs(args, args.configs)
    passkey_configs = _configs(args, args.passkey_configs if args.passkey_lengths else [], baseline=False)
    smoothed = [c.name for c in configs if c.smoothed]
    if smoothed:
        args._parser.error(f"mean smoothing (_smk/_smv) is a fake-quant study option: {smoothed}")
    model, tokenizer = load(args)
    scales = ScaleSource(model, tokenizer, args)
    windows = token_windows(tokenizer, eval_texts(data_dir), settings.windows, settings.window_tokens)
    ev = LockstepEval(model, configs, settings, scales, progress)
    rows: list[dict[str, Any]] = []
    for mode in args.modes:
        accs = ev.run_prefill(windows) if mode == "prefill" else ev.run_decode(windows)
        ref = accs[BASELINE_NAME]
        rows += [{"config": c.name, "mode": mode, **summarize(accs[c.name], ref)} for c in configs]
        progress(f"{mode} done after {time.time() - t0:.0f} s")
    passkey = []
    for cfg in passkey_configs:
        cases = make_cases(tokenizer, args.passkey_lengths, args.passkey_depths)
        passkey += run_passkey(
            model, tokenizer, cfg, cases, global_scales=scales(cfg), chunk=args.passkey_chunk
        )
        progress(f"passkey {cfg.name} done after {time.time() - t0:.0f} s")
    doc = _header(args, model, configs, scales)
    doc["settings"] = {**asdict(settings), "passkey_chunk": args.passkey_chunk, "data_dir": str(data_dir)}
    doc["rows"] = rows
    doc["passkey"] = [asdict(r) for r in passkey]
    doc["passkey_summary"] = passkey_summary(passkey)
    doc["elapsed_s"] = round(time.time() - t0, 1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    plot(doc, args.plot or out.with_suffix(".png"))
    print(markdown_table(rows))
    if passkey:
        print()
        print(passkey_table(doc["passkey_summary"]))
    return 0


def run_study_cmd(args: argparse.Namespace) -> int:
    t0 = time.time()
    data_dir = checked_data_dir(args)
    configs = _configs(args, args.configs)
    model, tokenizer = load(args)
    scales = ScaleSource(model, tokenizer, args)
    windows = token_windows(tokenizer, eval_texts(data_dir), args.windows, args.window_tokens)
    smoothing = SmoothingSource(scales)
    accs = run_study(model, windows, configs, smoothing, args.batch, progress, args.chunk, smoothing.means)
    mode = f"fakequant_chunk{args.chunk}" if args.chunk else "fakequant"
    rows = [
        {"config": c.name, "mode": mode, **summarize(accs[c.name], accs[BASELINE_NAME])}
        for c in configs
    ]
    doc = _header(args, model, configs, scales)
    doc["settings"] = {
        "windows": args.windows,
        "window_tokens": args.window_tokens,
        "chunk": args.chunk,
        "data_dir": str(data_dir),
    }
    if smoothing.stats is not None:
        doc["smoothing"] = smoothing.to_json()
    doc["rows"] = rows
    doc["elapsed_s"] = round(time.time() - t0, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    for r in rows:
        print(
            f"{r['config']:28s} KL {r['kl']:.4f} [{r['kl_ci'][0]:.4f}, {r['kl_ci'][1]:.4f}]  top1 {100 * r['top1']:.1f}%  ppl {r['ppl']:.3f} ({r['ppl_delta']:+.3f})"
        )
    return 0


def run_speed_cmd(args: argparse.Namespace) -> int:
    configs = _configs(args, args.configs, baseline=False)
    model, _ = load(args)
    rows = speed_table(model, configs, args.batch, args.context, args.steps, progress)
    for r in rows:
        print(
            f"{r['config']:24s} B={r['batch']} L={r['context']}  {r['step_ms']:.2f} ms/step  x{r['vs_first']:.3f}"
        )
    if args.out:
        doc = {"device": str(model.device), "model_dtype": str(model.dtype), "rows": rows}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def run_merge_cmd(args: argparse.Namespace) -> int:
    """Concatenate rows and passkey results; settings and scales must agree where both parts have them."""
    docs = [json.loads(Path(p).read_text()) for p in args.parts]
    out = dict(docs[0])
    for d in docs[1:]:
        if d["model"] != out["model"] or d["baseline_dtype"] != out["baseline_dtype"]:
            raise SystemExit(f"cannot merge runs of different models or dtypes: {args.parts}")
        out["configs"] = {**out["configs"], **d["configs"]}
        out["scales"] = {**out["scales"], **d["scales"]}
        out["rows"] = out["rows"] + d["rows"]
        out["passkey"] = out["passkey"] + d["passkey"]
        out["passkey_summary"] = out["passkey_summary"] + d["passkey_summary"]
        out["elapsed_s"] = max(out["elapsed_s"], d["elapsed_s"])
    # NOTE: every part runs the baseline in lockstep; identical settings give identical baseline rows.
    seen: set[tuple[str, str]] = set()
    rows = []
    for r in out["rows"]:
        if (r["config"], r["mode"]) not in seen:
            seen.add((r["config"], r["mode"]))
            rows.append(r)
    out["rows"] = rows
    out["parts"] = [{"file": Path(p).name, "settings": d["settings"]} for p, d in zip(args.parts, docs)]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    plot(out, Path(args.out).with_suffix(".png"))
    print(markdown_table(out["rows"]))
    if out["passkey_summary"]:
        print()
        print(passkey_table(out["passkey_summary"]))
    return 0
