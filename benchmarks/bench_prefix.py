"""Prefix-cache benchmark for the GPU: cache hit rate, output throughput and TTFT under eviction pressure.

Two generated workloads, each swept over client concurrency, for every KV dtype, with and without the
host tier (``--enable-hierarchical-cache``):

* ``shared_prefix``: groups of requests sharing a long system prompt, short questions;
* ``agentic``: sessions whose every turn resends the whole history (prompt, earlier replies, earlier
  tool outputs) plus a new tool output of a few thousand tokens, with think time between turns.

Clients are closed-loop: each sends its next request when the last one finished (plus the think time),
so ``concurrency`` clients keep at most that many requests in flight. The engine runs in-process; TTFT is
measured at step granularity (the time from submission to the step that returns the first token).

Pool sizing: every dtype gets the same KV *byte* budget (``--kv-budget-gib``, default 3 GiB, dummy
Llama-3.1-8B, 128 KiB/token in bf16), the bf16 tail pool of the quantized dtypes (W=64, 32 running
requests: 2624 tokens, 0.32 GiB) carved out of it: bf16 holds 24,544 tokens, fp8_e4m3 43,856 and nvfp4
77,968. An agentic session ends at ~4.1K tokens (1K system + 2 tool outputs of 1-2K + replies), so the
working set is ~49K tokens at concurrency 12 (more than fp8 holds, less than nvfp4) and ~131K at 32
(more than any); the shared-prefix workload has ``max(4, concurrency)`` groups of 2K-token system prompts.
The host tier gets the same bytes for every dtype too (``--hicache-size``, default 16 GiB).

Device time (rough, H200): ~1 min per (dtype, host tier) per workload, ~15 min for everything; run it in
parts (``--workloads agentic``, ``--kv-dtypes ...``, ``--hicache off|on``) and ``--merge`` the files.

    PYTHONPATH=. python benchmarks/bench_prefix.py                       # everything, on the GPU
    PYTHONPATH=. python benchmarks/bench_prefix.py --workloads agentic --hicache off
    PYTHONPATH=. python benchmarks/bench_prefix.py --workloads agentic --top-only hicache+bf16  # acceptance, ~8 min
    PYTHONPATH=. python benchmarks/bench_prefix.py --merge a.json b.json # combine partial runs + plot
    PYTHONPATH=. python benchmarks/bench_prefix.py --smoke               # tiny CPU run of the same code

Writes ``$OUT/prefix-h200.json`` (rows: workload, kv_dtype, hicache, concurrency, hit_rate,
output_tok_s, ttft_ms, ...) after every row, and ``prefix-h200.png`` at the end.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_timing import rotating_last

from nibblekv.cache import size_pool
from nibblekv.config import EngineConfig
from nibblekv.engine.engine import Engine
from nibblekv.engine.gc_heap import frozen_heap
from nibblekv.engine.sampling_params import SamplingParams
from nibblekv.formats import parse_kv_dtype
from nibblekv.model import load_model

GIB = 1 << 30
KV_DTYPES = ("bf16", "fp8_e4m3", "nvfp4")
CONCURRENCY = (1, 2, 4, 8, 12, 16, 24, 32)
TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 320, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "bos_token_id": 256, "eos_token_id": 257,
}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes on CPU (checks the code path)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    p.add_argument("--name", default="prefix-h200", help="output file stem")
    p.add_argument("--merge", type=Path, nargs="+", help="combine these result files (no run) and plot")
    p.add_argument("--model", default="llama-3.1-8b",
                   help="preset or config.json (--smoke: a tiny dense model unless a config.json is given); "
                   "a hybrid model needs fla-core on the GPU")  # fmt: skip
    p.add_argument("--disable-radix-cache", action="store_true",
                   help="no prefix cache (rows: radix false), the baseline of a hit rate")  # fmt: skip
    p.add_argument("--max-mamba-cache-size", type=int, default=None,
                   help="hybrid models: state slots, running requests' plus snapshots' (the engine's flag; "
                   "default twice the top concurrency)")  # fmt: skip
    p.add_argument("--workloads", nargs="+", default=["shared_prefix", "agentic"])
    p.add_argument("--kv-dtypes", nargs="+", default=list(KV_DTYPES))
    p.add_argument("--hicache", choices=("off", "on", "both"), default="both")
    p.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    p.add_argument("--kv-budget-gib", type=float, default=3.0, help="KV pool bytes, the same for every dtype")
    p.add_argument(
        "--hicache-kv-dtypes",
        nargs="+",
        default=None,
        help="the dtypes that run with the host tier (default: all)",
    )
    p.add_argument("--top-only", choices=("none", "hicache", "hicache+bf16"), default="none",
                   help="run only the highest concurrency for host-tier engines (hicache) and also for bf16 "
                   "without it (hicache+bf16): the rows the acceptance checks need, so one device call "
                   "holds the whole agentic sweep")  # fmt: skip
    p.add_argument("--hicache-size", type=float, default=16.0, help="host tier GiB (same for every dtype)")
    p.add_argument("--hicache-write-policy", default="write_back")
    p.add_argument("--kv-recent-window", type=int, default=64)
    ov = p.add_mutually_exclusive_group()
    ov.add_argument("--enable-overlap-schedule", dest="overlap", action="store_const", const=True, default=None,
                    help="schedule decode step N+1 while step N runs (host work hidden behind the GPU's; "
                    "default: the engine's, on for one CUDA GPU without the host tier; this flag turns it on for the "
                    "host-tier engines too)")  # fmt: skip
    ov.add_argument("--disable-overlap-schedule", dest="overlap", action="store_const", const=False)
    p.add_argument("--chunked-prefill-size", type=int, default=8192)
    p.add_argument("--schedule-policy", choices=("fcfs", "lpm"), default="fcfs", help="the engine's admission order")
    # shared_prefix
    p.add_argument("--min-groups", type=int, default=4, help="groups per run: max(concurrency, this)")
    p.add_argument("--per-group", type=int, default=4)
    p.add_argument("--system-len", type=int, default=2000)
    p.add_argument("--question-len", type=int, default=64)
    p.add_argument("--sp-output-len", type=int, default=32)
    # agentic
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--agent-system-len", type=int, default=1000)
    p.add_argument("--tool-len", type=int, nargs=2, default=[1000, 2000], help="tool output tokens (range)")
    p.add_argument("--agent-output-len", type=int, default=64)
    p.add_argument("--think-s", type=float, default=0.2)
    p.add_argument("--min-sessions", type=int, default=4, help="sessions per run: max(concurrency, this)")
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1, help="runs of each row up to --repeat-max-concurrency; "
                   "the row is the median by output tok/s (all runs listed in output_tok_s_runs)")  # fmt: skip
    p.add_argument("--repeat-max-concurrency", type=int, default=8,
                   help="rows above it run once (where dtypes differ by far more than run-to-run noise)")  # fmt: skip
    args = p.parse_args(argv)
    if args.smoke:  # tiny sizes for every size flag left at its default
        if args.concurrency == p.get_default("concurrency"):
            args.concurrency = [1, 4]
        smoke = dict(
            kv_budget_gib=256 * 1024 / GIB, hicache_size=1024 * 1024 / GIB, kv_recent_window=16,
            chunked_prefill_size=64, min_groups=2, per_group=2, system_len=48, question_len=8,
            sp_output_len=4, turns=3, agent_system_len=24, tool_len=[16, 32], agent_output_len=4, think_s=0.01,
            min_sessions=2,
        )  # fmt: skip
        for key, value in smoke.items():
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
    return args


# ---- workloads: per client, a list of sessions; a session is its first prompt plus later tool outputs ----
@dataclass
class Session:
    prompt: list[int]
    tools: list[list[int]]  # the new input of each later turn
    output_len: int


def _tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(10, min(vocab, 32000)) for _ in range(n)]


def shared_prefix(args: argparse.Namespace, concurrency: int, vocab: int) -> list[list[Session]]:
    rng = random.Random(f"{args.seed}-sp-{concurrency}")
    systems = [_tokens(rng, args.system_len, vocab) for _ in range(max(concurrency, args.min_groups))]
    reqs = [Session(s + _tokens(rng, args.question_len, vocab), [], args.sp_output_len)
            for s in systems for _ in range(args.per_group)]  # fmt: skip
    rng.shuffle(reqs)
    return [reqs[i::concurrency] for i in range(concurrency)]


def agentic(args: argparse.Namespace, concurrency: int, vocab: int) -> list[list[Session]]:
    rng = random.Random(f"{args.seed}-ag-{concurrency}")
    sessions = [
        Session(
            _tokens(rng, args.agent_system_len + 32, vocab),
            [_tokens(rng, rng.randint(*args.tool_len), vocab) for _ in range(args.turns - 1)],
            args.agent_output_len,
        )
        for _ in range(max(concurrency, args.min_sessions))
    ]
    return [sessions[i::concurrency] for i in range(concurrency)]


@dataclass
class Client:
    sessions: list[Session]
    think_s: float
    history: list[int] = field(default_factory=list)
    turn: int = 0
    ready_at: float = 0.0
    in_flight: bool = False

    def next_prompt(self) -> tuple[list[int], int] | None:
        if not self.sessions:
            return None
        s = self.sessions[0]
        self.history = list(s.prompt) if self.turn == 0 else self.history + s.tools[self.turn - 1]
        return self.history, s.output_len

    def finished(self, output: list[int], now: float) -> None:
        s = self.sessions[0]
        self.in_flight = False
        self.history = self.history + output
        self.turn += 1
        if self.turn > len(s.tools):
            self.sessions.pop(0)
            self.turn, self.history = 0, []
            self.ready_at = now
        else:
            self.ready_at = now + self.think_s


def drive(engine: Engine, clients: list[Client]) -> dict[str, float]:
    """Run the closed loop to the end; throughput, TTFT and the cache numbers the API reported."""
    owner: dict[str, tuple[Client, float]] = {}
    first: set[str] = set()
    ttfts: list[float] = []
    n_out = n_prompt = n_cached = 0
    t0 = time.perf_counter()
    while True:
        now = time.perf_counter()
        for c in clients:
            if not c.in_flight and now >= c.ready_at:
                nxt = c.next_prompt()
                if nxt is not None:
                    prompt, out_len = nxt
                    rid = engine.add_request(
                        prompt, SamplingParams(temperature=0, max_new_tokens=out_len, ignore_eos=True)
                    )
                    owner[rid], c.in_flight = (c, now), True
        if engine.has_unfinished():
            outs = engine.step()
            t = time.perf_counter()
            for o in outs:
                client, sent = owner[o.request_id]
                if o.completion_tokens > 0 and o.request_id not in first:
                    first.add(o.request_id)
                    ttfts.append(t - sent)
                if o.finished:
                    n_out += o.completion_tokens
                    n_prompt += o.prompt_tokens
                    n_cached += o.cached_tokens
                    client.finished(list(o.token_ids), t)
            continue
        waits = [c.ready_at for c in clients if c.sessions and not c.in_flight]
        if not waits:
            break
        time.sleep(max(0.0, min(waits) - time.perf_counter()))
    secs = time.perf_counter() - t0
    return {
        "hit_rate": round(n_cached / max(1, n_prompt), 4),
        "output_tok_s": round(n_out / secs, 1),
        "ttft_ms": round(1e3 * sum(ttfts) / max(1, len(ttfts)), 1),
        "requests": len(owner), "prompt_tokens": n_prompt, "cached_tokens": n_cached,
        "output_tokens": n_out, "seconds": round(secs, 2),
    }  # fmt: skip


# ---- engines --------------------------------------------------------------------------------------
def load(args: argparse.Namespace) -> tuple[Any, Any]:
    name = args.model
    if args.smoke and not name.endswith(".json"):
        path = Path(tempfile.mkdtemp()) / "config.json"
        path.write_text(json.dumps(TINY))
        name = str(path)
    return load_model(name, load_format="dummy", device="cpu" if args.smoke else "cuda", seed=args.seed)


def pool_tokens(args: argparse.Namespace, model: Any, kv: str, max_running: int) -> int:
    """Main-pool tokens that ``--kv-budget-gib`` holds for this dtype (the tail pool carved out first)."""
    mc = model.config
    spec = size_pool(
        num_layers=mc.num_kv_layers, num_kv_heads=mc.num_kv_heads, head_dim=mc.head_dim, page_size=16,
        kv_dtype=parse_kv_dtype(kv, model.dtype), model_kv_dtype=parse_kv_dtype("auto", model.dtype),
        recent_window=args.kv_recent_window, max_running_requests=max_running,
        budget_bytes=int(args.kv_budget_gib * GIB), max_total_tokens=None,
    )  # fmt: skip
    return spec.max_total_num_tokens


def make_engine(args: argparse.Namespace, loaded: tuple[Any, Any], kv: str, hicache: bool) -> Engine:
    max_running = max(args.concurrency)
    cfg = EngineConfig(
        load_format="dummy", device="cpu" if args.smoke else "cuda", seed=args.seed, kv_cache_dtype=kv,
        max_total_tokens=pool_tokens(args, loaded[0], kv, max_running), max_running_requests=max_running,
        chunked_prefill_size=args.chunked_prefill_size, kv_recent_window=args.kv_recent_window,
        disable_cuda_graph=args.disable_cuda_graph, decode_log_interval=0,
        enable_hierarchical_cache=hicache, hicache_size=args.hicache_size,
        disable_radix_cache=args.disable_radix_cache, max_mamba_cache_size=args.max_mamba_cache_size,
        hicache_write_policy=args.hicache_write_policy,
        # NOTE: the overlap schedule's default leaves the host tier out; --enable-overlap-schedule includes it
        enable_overlap_schedule=args.overlap, schedule_policy=args.schedule_policy,
    )  # fmt: skip
    engine = Engine(cfg, loaded=loaded)
    engine.stream = True  # step() returns every advanced request's output (first tokens: TTFT)
    engine.generate([[11] * 40], SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True))  # warm-up
    return engine


def reset(engine: Engine) -> None:
    """Empty the prefix cache (both tiers) so runs do not share cached pages."""
    engine.scheduler.cache.flush()
    assert engine.pool.all_free()


def concurrencies(args: argparse.Namespace, kv: str, hicache: bool) -> list[int]:
    """The concurrency sweep of one engine: all of ``--concurrency``, or its top per ``--top-only``."""
    sweep = sorted(args.concurrency)
    top = hicache or (args.top_only == "hicache+bf16" and kv == "bf16")
    return sweep[-1:] if args.top_only != "none" and top else sweep


def run(args: argparse.Namespace, path: Path) -> list[dict[str, Any]]:
    loaded = load(args)
    vocab = loaded[0].config.vocab_size
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.hicache]
    rows: list[dict[str, Any]] = []
    for kv in rotating_last(args.kv_dtypes):
        for hicache in modes:
            if hicache and args.hicache_kv_dtypes and kv not in args.hicache_kv_dtypes:
                continue
            engine = make_engine(args, loaded, kv, hicache)
            with frozen_heap():  # as `nibblekv serve` runs (engine/gc_heap.py)
                for workload in args.workloads:
                    make = shared_prefix if workload == "shared_prefix" else agentic
                    think = 0.0 if workload == "shared_prefix" else args.think_s
                    # NOTE: a discarded pass of the same workload first, at the sweep's top concurrency, so
                    # Triton's JIT compiles (one per new specialization of the extend/decode kernels: batch
                    # sizes, chunk shapes) are not timed in the rows. With only 2 warm-up sessions both dtypes'
                    # 8-session rows fell to 147-157 tok/s from 325-348 at 4.
                    warm = argparse.Namespace(**{**vars(args), "seed": f"{args.seed}-warm-up"})
                    reset(engine)
                    top = max(concurrencies(args, kv, hicache))
                    drive(engine, [Client(s, 0.0) for s in make(warm, top, vocab)])
                    for c in concurrencies(args, kv, hicache):
                        runs = []
                        for _ in range(args.repeats if c <= args.repeat_max_concurrency else 1):
                            reset(engine)
                            runs.append(drive(engine, [Client(s, think) for s in make(args, c, vocab)]))
                        res = sorted(runs, key=lambda r: r["output_tok_s"])[(len(runs) - 1) // 2]  # lower median
                        if len(runs) > 1:
                            res = {**res, "output_tok_s_runs": [r["output_tok_s"] for r in runs]}
                        rows.append({
                            "workload": workload, "kv_dtype": kv, "hicache": hicache, "concurrency": c, **res,
                            "radix": not args.disable_radix_cache, "model": args.model,
                            "max_mamba_cache_size": args.max_mamba_cache_size,
                            "pool_tokens": engine.max_total_num_tokens, "kv_budget_gib": args.kv_budget_gib,
                            "hicache_gib": args.hicache_size if hicache else 0.0,
                            "overlap": engine.overlap_schedule, "schedule_policy": args.schedule_policy,
                        })  # fmt: skip
                        print(json.dumps(rows[-1]), flush=True)
                        write(path, args, rows)
            reset(engine)
            del engine
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return rows


# ---- results --------------------------------------------------------------------------------------
def acceptance(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's acceptance checks, computed from the agentic rows (None where rows are missing)."""
    ag = {(r["kv_dtype"], r["hicache"], r["concurrency"]): r for r in rows if r["workload"] == "agentic"}
    out: dict[str, Any] = {}
    cs = sorted({c for _, _, c in ag})
    high = [c for c in cs if c >= 12]
    pairs = [(ag.get(("nvfp4", False, c)), ag.get(("fp8_e4m3", False, c))) for c in cs]
    if high and all(ag.get((k, False, c)) for k in ("nvfp4", "fp8_e4m3") for c in high):
        out["nvfp4_beats_fp8_at_concurrency_ge_12"] = all(
            ag[("nvfp4", False, c)]["hit_rate"] > ag[("fp8_e4m3", False, c)]["hit_rate"]
            and ag[("nvfp4", False, c)]["output_tok_s"] > ag[("fp8_e4m3", False, c)]["output_tok_s"]
            for c in high
        )
    if pairs and all(a and b for a, b in pairs):
        out["fp8_throughput_never_above_nvfp4"] = all(
            b["output_tok_s"] <= a["output_tok_s"] for a, b in pairs
        )  # type: ignore[index]
    if cs:
        top = cs[-1]
        rises = {k: (ag[(k, True, top)]["hit_rate"] > ag[(k, False, top)]["hit_rate"])
                 for k in KV_DTYPES if (k, True, top) in ag and (k, False, top) in ag}  # fmt: skip
        if rises:
            out[f"hicache_raises_hit_rate_at_{top}"] = rises
    return out


def write(path: Path, args: argparse.Namespace | None, rows: list[dict[str, Any]]) -> None:
    device = "cpu" if args is None or args.smoke else torch.cuda.get_device_name()
    meta = (
        {}
        if args is None
        else {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    )
    # NOTE: commit from the caller's env (the device copy's git HEAD can be stale), date of the run
    meta["commit"] = os.environ.get("COMMIT", "unknown")
    meta["date"] = datetime.date.today().isoformat()
    path.write_text(
        json.dumps({"device": device, **meta, "acceptance": acceptance(rows), "rows": rows}, indent=1)
    )


def plot(rows: list[dict[str, Any]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = sorted({r["workload"] for r in rows})
    metrics = [
        ("hit_rate", "cache hit rate"),
        ("output_tok_s", "output tok/s"),
        ("ttft_ms", "mean TTFT (ms)"),
    ]
    fig, axes = plt.subplots(len(workloads), 3, figsize=(15, 4.2 * len(workloads)), squeeze=False)
    colors = {"bf16": "tab:blue", "fp8_e4m3": "tab:orange", "nvfp4": "tab:green"}
    for i, w in enumerate(workloads):
        for j, (key, label) in enumerate(metrics):
            ax = axes[i][j]
            for kv in KV_DTYPES:
                for hicache in (False, True):
                    pts = sorted((r["concurrency"], r[key]) for r in rows
                                 if r["workload"] == w and r["kv_dtype"] == kv and r["hicache"] == hicache)  # fmt: skip
                    if pts:
                        ax.plot(*zip(*pts), marker="o", color=colors.get(kv), linestyle="--" if hicache else "-",
                                label=f"{kv}{' + host tier' if hicache else ''}")  # fmt: skip
            ax.set_title(f"{w}: {label}")
            ax.set_xlabel("concurrency")
            ax.set_xscale("log", base=2)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def print_table(rows: list[dict[str, Any]]) -> None:
    names = [
        "workload",
        "kv_dtype",
        "hicache",
        "concurrency",
        "hit_rate",
        "output_tok_s",
        "ttft_ms",
        "pool_tokens",
    ]
    widths = [max(len(n), *(len(str(r[n])) for r in rows)) for n in names]
    print("\n" + "  ".join(n.ljust(w) for n, w in zip(names, widths)))
    for r in rows:
        print("  ".join(str(r[n]).ljust(w) for n, w in zip(names, widths)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.name + ("-smoke" if args.smoke else "")
    path = args.out / f"{stem}.json"
    if args.merge:
        rows = [r for f in args.merge for r in json.loads(f.read_text())["rows"]]
        write(path, None, rows)
    else:
        if not args.smoke and not torch.cuda.is_available():
            print("no CUDA device: use --smoke for the CPU check", file=sys.stderr)
            return 2
        rows = run(args, path)
    plot(rows, args.out / f"{stem}.png")
    print_table(rows)
    print("\nacceptance:", json.dumps(acceptance(rows)))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
