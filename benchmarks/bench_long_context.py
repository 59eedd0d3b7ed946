"""Long-context decode throughput, TTFT and resident requests per KV dtype: the published table (issue 47).

For each model and input length (default Llama-3.1-8B dummy weights at 32K / 160K / 1M input, 1,024 output
tokens, radix cache off), per KV dtype:

* ``capacity`` rows: each dtype runs as many requests as its own pool holds (the engine's sizing,
  ``nibblekv.engine.setup.resident_capacity``); ``matched`` rows: every dtype runs fp8_e4m3's count;
* ``decode_tok_s``: running requests over the median decode step at full batch (the requests are admitted
  by synthetic prefill: pages allocated, not computed; decode time does not depend on the cached values);
  ``--decode-steps N`` stops each request after N + 2 tokens (the pool is still sized for the full output)
  to bound device time: the rows say so (``decode_steps_cap``);
* ``ttft_mean_s``: ``ttft_kind`` ``real`` is the mean time to first token of ``--ttft-requests`` requests
  prefilled one after another through the engine (chunked prefill, the extend path over the cached prefix),
  measured once per dtype and input length on the same engine (up to ``--profile-max-input``, one more
  prefill under the torch profiler gives ``prefill_kernels``: the top GPU kernels, dtype beside dtype);
  ``sampled`` past ``--ttft-max-input``: prefill chunks timed at ``--ttft-sample-chunks`` offsets over a
  synthetic prefix, fitted and summed (``long_context_ttft``; ``ttft_sampled`` holds the chunks and the
  fit, also beside a real TTFT, where it checks the method); ``synthetic`` (none) with neither;
* ``plan_requests``: what the planner (``nibblekv plan``'s engine count) says for the same budget, model
  and context; ``capacity_requests``: the engine's own count.

Past the model's ``max_position_embeddings`` the engine runs with ``--allow-long-context`` and RoPE scaling
given as an override (llama3 scaling for Llama, linear otherwise; recorded in ``rope_scaling``).

Bounded and observable: every row (or skip, with its reason) is written to ``--out`` as it finishes and
logged with flush; host RAM and the pool's capacity are checked before a size is attempted; rows stop once
``--time-budget-s`` is spent.

    PYTHONPATH=. python benchmarks/bench_long_context.py --input-lens 32768 --out $OUT
    PYTHONPATH=. python benchmarks/bench_long_context.py --merge a.json b.json --out benchmarks/results
    PYTHONPATH=. python benchmarks/bench_long_context.py --smoke --out /tmp/lc   # CPU, seconds
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_timing import SharedModel, decode_run, free_memory, read_bandwidth, rotating_last
from long_context_merge import merge_files
from long_context_ttft import PrefillTimes, measure_ttft, prefill_kernels, sampled_ttft
from plot_long_context import plot

from nibblekv.config import QUANTIZATIONS, SSM_DTYPES, EngineConfig
from nibblekv.engine.engine import Engine
from nibblekv.engine.gc_heap import frozen_heap
from nibblekv.engine.sampling_params import SamplingParams
from nibblekv.engine.setup import kv_budget_bytes, resident_capacity
from nibblekv.formats import KVDtype, parse_kv_dtype
from nibblekv.model import load_model
from nibblekv.model.fp8 import QuantMethod
from nibblekv.model.presets import PRESETS
from nibblekv.planner.engine_fit import EngineOptions, resident_requests
from nibblekv.planner.shape import shape_from_config, text_config

RESULT_NAME = "long-context-h200.json"
KV_DTYPES = ("bf16", "fp8_e4m3", "nvfp4")
# The published NVFP4 results (vs fp8_e4m3, 1,024 output tokens, radix cache off): capacity-driven decode
# throughput ratio and resident requests (fp8, nvfp4) per input length; matched-concurrency ratio band.
PUBLISHED: dict[str, Any] = {
    "capacity_ratio": {"32768": 1.3737, "163840": 1.5775, "1048576": 1.7846},
    "resident": {"32768": [44, 70], "163840": [10, 15], "1048576": [1, 2]},
    "matched_ratio": [1.26, 1.30],
}
# SmolLM2's architecture shrunk to seconds on a CPU (2 layers, hidden 64, vocab 512), 512 positions
SMOKE_OVERRIDES = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
    "max_position_embeddings": 512,
}
# ... and for a hybrid preset (Qwen3.5): one full-attention layer of four, small linear-attention heads
SMOKE_HYBRID_OVERRIDES = {
    "num_hidden_layers": 4,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
}
SMOKE_BUDGET_GIB = 0.0006  # a few requests per row
HOST_BYTES_PER_TOKEN = 160  # prompt ids, request token lists and page lists per token (Python ints)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["llama-3.1-8b"], help="presets (dummy weights)")
    p.add_argument("--input-lens", type=int, nargs="+", default=[32768, 163840, 1048576])
    p.add_argument("--output-len", type=int, default=1024)
    p.add_argument("--kv-dtypes", nargs="+", default=list(KV_DTYPES), choices=KV_DTYPES)
    p.add_argument("--modes", nargs="+", default=["matched", "capacity"], choices=("matched", "capacity"))
    p.add_argument(
        "--decode-steps",
        type=int,
        default=64,
        help="stop each request after this many decode "
        "steps + 2 (0: the full --output-len); the pool is sized for the full output either way",
    )
    p.add_argument("--ttft-requests", type=int, default=2, help="requests prefilled one after another per "
                   "dtype for ttft_mean_s (0: none)")  # fmt: skip
    p.add_argument(
        "--ttft-max-input", type=int, default=200_000, help="longer inputs get no real TTFT (ttft_kind "
        "sampled or synthetic)"
    )
    p.add_argument("--ttft-sample-chunks", type=int, default=3, help="prefill chunks timed at this many "
                   "offsets per dtype for the chunk-sampled TTFT (long_context_ttft; 0: none): ttft_kind "
                   "sampled past --ttft-max-input, beside the real one below it")  # fmt: skip
    p.add_argument("--profile-max-input", type=int, default=32768, help="at inputs up to this, one more "
                   "real prefill per dtype runs under the torch profiler: its top GPU kernels in the row")  # fmt: skip
    p.add_argument("--profile-steps", type=int, default=0, help="profile this many decode steps per row (after "
                   "3) with the torch profiler: their top GPU kernels in the row's decode_kernels")  # fmt: skip
    p.add_argument("--time-budget-s", type=float, default=520.0, help="no new row starts after this")
    p.add_argument("--mem-fraction-static", type=float, default=0.88)
    p.add_argument("--chunked-prefill-size", type=int, default=8192)
    p.add_argument("--kv-recent-window", type=int, default=64)
    p.add_argument("--quantization", choices=QUANTIZATIONS, default=None,
                   help="weights quantized at load (fp8: per-channel FP8, the published runs' weights); rows "
                   "say which in 'weights'")  # fmt: skip
    p.add_argument("--json-model-override-args", default=None, help="merged over the RoPE override")
    p.add_argument("--mamba-ssm-dtype", choices=SSM_DTYPES, default=None,
                   help="hybrid models' recurrent-state dtype (default: the config's)")  # fmt: skip
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    p.add_argument("--name", default=RESULT_NAME, help="result file name inside --out")
    p.add_argument("--merge", type=Path, nargs="+", default=None,
                   help="combine these files' rows; a later file's rows replace an earlier's of the same "
                   "model, weights, input length, mode and KV dtype")
    p.add_argument("--smoke", action="store_true", help="CPU, a 2-layer SmolLM2 shape, tiny lengths")
    args = p.parse_args(argv)
    if args.smoke:  # tiny sizes, where the flag was not given
        smoke = {"models": ["smollm2-135m"], "input_lens": [256, 600], "output_len": 4, "decode_steps": 2,
                 "chunked_prefill_size": 64, "kv_recent_window": 16, "ttft_requests": 1}  # fmt: skip
        for key, value in smoke.items():
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
    return args


def log(t0: float, msg: str) -> None:
    print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)


def rope_override(name: str, context: int) -> dict[str, Any]:
    """RoPE scaling that stretches a preset past its positions (dummy weights: timing only), or nothing."""
    cfg = text_config(PRESETS[name])  # hybrid presets nest the text model's config
    max_pos = int(cfg["max_position_embeddings"])
    if context <= max_pos:
        return {}
    scaling = cfg.get("rope_scaling") or {}
    if scaling.get("rope_type") == "llama3":
        orig = int(scaling["original_max_position_embeddings"])
        return {"rope_scaling": {**scaling, "factor": float(math.ceil(context / orig))}}
    return {"rope_scaling": {"rope_type": "linear", "factor": float(math.ceil(context / max_pos))}}


def host_available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def commit_id() -> str:
    """``$COMMIT`` where the caller names the code under test (a device copy's git HEAD may differ), else
    git's HEAD."""
    if os.environ.get("COMMIT"):
        return os.environ["COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
        if out.returncode == 0:
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


class Results:
    """The result document, rewritten after every row or skip."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.path = args.out / args.name
        args.out.mkdir(parents=True, exist_ok=True)
        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() and not args.smoke else "cpu (smoke)"
        self.doc: dict[str, Any] = {
            "commit": commit_id(), "gpu": gpu,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "torch": torch.__version__, "args": vars(args) | {"out": str(args.out), "merge": None},
            "published": PUBLISHED, "rows": [], "skipped": [],
        }  # fmt: skip

    def add(self, key: str, item: dict[str, Any]) -> None:
        self.doc[key].append(item)
        self.path.write_text(json.dumps(self.doc, indent=1))


def bench_length(
    args: argparse.Namespace,
    res: Results,
    name: str,
    models: SharedModel,
    input_len: int,
    bandwidth: float,
    t0: float,
) -> None:
    model, _, overrides = models.current
    page = EngineConfig().page_size
    context = input_len + args.output_len + page
    per_request = (-(-(input_len + args.output_len) // page) + 1) * page
    max_pos = model.config.max_position_embeddings
    where: dict[str, Any] = {"model": name, "weights": args.quantization or "bf16", "input_len": input_len,
             "output_len": args.output_len}  # fmt: skip
    if args.mamba_ssm_dtype:
        where["ssm_dtype"] = args.mamba_ssm_dtype
    mem: dict[str, Any] = (
        {"device": "cpu", "mem_budget_gib": SMOKE_BUDGET_GIB} if args.smoke
        else {"device": "cuda", "mem_fraction_static": args.mem_fraction_static}
    )  # fmt: skip
    base = EngineConfig(
        load_format="dummy", chunked_prefill_size=args.chunked_prefill_size,
        kv_recent_window=args.kv_recent_window,
        disable_radix_cache=True, context_length=context, allow_long_context=context > max_pos,
        quantization=args.quantization, mamba_ssm_dtype=args.mamba_ssm_dtype,
        decode_log_interval=0, **mem,
    )  # fmt: skip
    free_memory()
    dtypes = sorted(set(args.kv_dtypes) | {"fp8_e4m3"}, key=KV_DTYPES.index)
    caps = {
        kv: resident_capacity(replace(base, kv_cache_dtype=kv), model, per_request, context) for kv in dtypes
    }
    budget = kv_budget_bytes(base, model.device) or 0
    ssm = {"mamba_ssm_dtype": args.mamba_ssm_dtype} if args.mamba_ssm_dtype else {}
    shape = shape_from_config({**PRESETS[name], **overrides, **ssm}, name)  # top-level keys beat text_config
    opts = EngineOptions(page, args.kv_recent_window, args.chunked_prefill_size,
                         model_dtype=parse_kv_dtype("auto", model.dtype),
                         disable_radix_cache=True)  # fmt: skip
    plans = {kv: resident_requests(shape, KVDtype(kv), budget, per_request, context, opts) for kv in dtypes}
    gib = budget / 2**30
    log(t0, f"{name} input {input_len}: context {context}, KV budget {gib:.2f} GiB, capacity {caps}, "
            f"planner {plans}")  # fmt: skip
    prompt = [10 + (i * 7919) % 30000 % (model.config.vocab_size - 10) for i in range(input_len)]
    del model  # NOTE: run_row's engines take the model from ``models``, which may reload it
    times = PrefillTimes()
    done: dict[tuple[str, int], dict[str, Any]] = {}
    for kv in rotating_last(args.kv_dtypes):
        for mode in args.modes:
            n = caps["fp8_e4m3"] if mode == "matched" else caps[kv]
            tag = {**where, "mode": mode, "kv_dtype": kv, "requests": n}
            why = None
            if n == 0 or caps[kv] < n:
                why = f"{kv} holds {caps[kv]} request(s) of {per_request} tokens, the row needs {max(n, 1)}"
            elif time.perf_counter() - t0 > args.time_budget_s:
                why = f"time budget {args.time_budget_s:.0f} s spent"
            host = host_available_bytes()
            need = n * (input_len + args.output_len) * HOST_BYTES_PER_TOKEN + (1 << 30)
            if why is None and host is not None and need > 0.8 * host:
                why = f"host RAM: needs ~{need / 2**30:.1f} GiB, {host / 2**30:.1f} GiB available"
            if why is not None:
                log(t0, f"skip {tag}: {why}")
                res.add("skipped", {**tag, "reason": why})
                continue
            if (kv, n) in done:  # the other mode ran this exact engine: same numbers
                row = {**done[(kv, n)], "mode": mode, "same_run_as": done[(kv, n)]["mode"]}
                res.add("rows", row)
                continue
            log(t0, f"row {tag}")
            row = run_row(
                args, models, replace(base, kv_cache_dtype=kv), n, prompt, per_request, bandwidth, times, t0
            )
            if "skip" in row:
                log(t0, f"skip {tag}: {row['skip']}")
                res.add("skipped", {**tag, "reason": row["skip"]})
                continue
            row = {**where, "mode": mode, "kv_dtype": kv, **row, "capacity_requests": caps[kv],
                   "plan_requests": plans[kv], "context_length": context,
                   "kv_budget_gib": round(gib, 3), "rope_scaling": overrides.get("rope_scaling")}  # fmt: skip
            done[(kv, n)] = row
            res.add("rows", row)
            log(
                t0,
                "  "
                + json.dumps({k: row[k] for k in ("decode_tok_s", "step_ms", "ttft_mean_s", "ttft_kind")}),
            )


def run_row(
    args: argparse.Namespace, models: SharedModel, cfg: EngineConfig, n: int, prompt: list[int],
    per_request: int, bandwidth: float, times: PrefillTimes, t0: float,
) -> dict[str, Any]:  # fmt: skip
    """One engine of ``n`` requests: TTFT (once per dtype), then the decode batch at full concurrency;
    ``{"skip": why}`` when the pool built now holds fewer (GPU memory moved since the sizing)."""
    started, kv = time.perf_counter(), cfg.kv_cache_dtype
    engine = Engine(replace(cfg, max_running_requests=n, cuda_graph_bs=(n,)), loaded=models.get(cfg)[:2])
    if engine.max_total_num_tokens < n * per_request:
        held = engine.max_total_num_tokens
        del engine
        free_memory()
        return {"skip": f"the pool built holds {held} tokens, {n} requests need {n * per_request}"}
    steps = args.output_len if args.decode_steps <= 0 else min(args.output_len, args.decode_steps + 2)
    real = 0 < args.ttft_requests and len(prompt) <= args.ttft_max_input
    if real and kv not in times.real:
        times.real[kv] = measure_ttft(engine, prompt, args.ttft_requests, args.chunked_prefill_size)
        log(t0, f"  ttft {kv}: {[round(x, 3) for x in times.real[kv]]} s")
        if len(prompt) <= args.profile_max_input:
            times.kernels[kv] = prefill_kernels(engine, prompt)
            log(t0, f"  prefill kernels {kv}: {json.dumps(times.kernels[kv])}")
    if args.ttft_sample_chunks > 0 and kv not in times.sampled:
        times.sampled[kv] = sampled_ttft(engine, prompt, args.chunked_prefill_size, args.ttft_sample_chunks)
        log(t0, f"  sampled ttft {kv}: {json.dumps(times.sampled[kv])}")
    params = SamplingParams(temperature=0, max_new_tokens=steps, ignore_eos=True)
    with frozen_heap():
        out = decode_run(engine, [prompt] * n, params, True, bandwidth, args.profile_steps)
    assert engine.pool.all_free()
    row = {
        "running_requests": out["running_requests"], "decode_tok_s": out["steady_tok_s"],
        "decode_tok_s_mean": out["decode_tok_s"], "step_ms": out["step_ms"],
        "step_floor_ms": out["step_floor_ms"],
        "decode_steps_timed": out["decode_steps_at_full"] - 1, "decode_steps_cap": args.decode_steps or None,
        **times.row_fields(kv),
        **({"decode_kernels": out["top_kernels"]} if out["top_kernels"] else {}),
        "max_total_num_tokens": engine.max_total_num_tokens, "cuda_graph": out["cuda_graph"],
        "wall_s": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    del engine
    free_memory()
    return row


def load(args: argparse.Namespace, name: str) -> SharedModel[tuple[Any, Any, dict[str, Any]]]:
    """(model, tokenizer, overrides) for the engines of every KV dtype: dummy weights, RoPE stretched to the
    longest context asked for."""
    longest = max(args.input_lens) + args.output_len + EngineConfig().page_size
    overrides = dict(SMOKE_OVERRIDES) if args.smoke else {}
    if args.smoke and "full_attention_interval" in text_config(PRESETS[name]):
        overrides |= SMOKE_HYBRID_OVERRIDES
    if args.smoke:
        base_pos = SMOKE_OVERRIDES["max_position_embeddings"]
        if longest > base_pos:
            overrides["rope_scaling"] = {
                "rope_type": "linear",
                "factor": float(math.ceil(longest / base_pos)),
            }
    else:
        overrides |= rope_override(name, longest)
    overrides |= json.loads(args.json_model_override_args or "{}")
    device = "cpu" if args.smoke else "cuda"
    quant = QuantMethod(args.quantization) if args.quantization else None

    def load_one(rotation: bool) -> tuple[Any, Any, dict[str, Any]]:
        model, tok = load_model(
            name, load_format="dummy", device=device, seed=0, overrides=overrides, quantization=quant,
            kv_rotation=rotation,
        )  # fmt: skip
        return model, tok, overrides

    return SharedModel(load_one)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        doc = merge_files(args.merge)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / args.name).write_text(json.dumps(doc, indent=1))
    else:
        if not args.smoke and not torch.cuda.is_available():
            print("no CUDA device: use --smoke for the CPU check", file=sys.stderr)
            return 2
        t0 = time.perf_counter()
        res = Results(args)
        bandwidth = read_bandwidth(
            torch.device("cpu" if args.smoke else "cuda"), 0.0625 if args.smoke else 4.0
        )
        for name in args.models:
            models = load(args, name)
            log(t0, f"loaded {name} (dummy), overrides {models.current[2]}")
            for input_len in args.input_lens:
                bench_length(args, res, name, models, input_len, bandwidth, t0)
            models.release()
        doc = res.doc
        log(t0, f"wrote {res.path}")
    png = (args.out / args.name).with_suffix(".png")
    try:
        plot(doc, png)  # NOTE: it imports matplotlib, which the GPU image may lack: --merge plots locally
    except ImportError as exc:
        print(f"plot skipped ({exc})", flush=True)
        return 0
    print(f"wrote {png}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
