"""``nibblekv bench serve``: load-test any OpenAI-compatible server (a pure HTTP client, no torch).

Example: ``nibblekv bench serve --base-url http://127.0.0.1:30000 --dataset random --num-prompts 200
--random-input-len 512 --random-output-len 128 --max-concurrency 32 --output-file run.json``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any

from nibblekv.cli_style import add_command, closed_fraction, positive_int

DATASETS = ("random", "shared-prefix", "agentic", "jsonl")
SERVE_HELP = "load-test an OpenAI-compatible server"
SERVE_DESCRIPTION = (
    "Load-test any OpenAI-compatible server (nibblekv, SGLang, vLLM) with SGLang's bench_serving flags: "
    "throughput, TTFT, TPOT and ITL percentiles, printed and optionally written as JSON. A pure HTTP "
    "client: it needs no GPU and no torch."
)
SERVE_EPILOG = """examples:
  nibblekv serve --kv-cache-dtype nvfp4 --port 30000 &   # ready when it logs 'The server is fired up'
  nibblekv bench serve --base-url http://127.0.0.1:30000 --num-prompts 200 --random-input-len 512 \\
      --random-output-len 128 --max-concurrency 32 --output-file run.json
  nibblekv bench serve --dataset shared-prefix --backend chat --num-prompts 64"""


def _add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:30000", help="server root (with or without /v1)")
    p.add_argument(
        "--backend", choices=("completions", "chat"), default="completions", help="endpoint to call"
    )
    p.add_argument("--model", default=None, help="model name (default: the server's first /v1/models entry)")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    p.add_argument(
        "--dataset",
        choices=DATASETS,
        default="random",
        help="random prompts; shared-prefix groups (--gsp-*); agentic multi-turn sessions (--agentic-*); "
        "or a jsonl file of prompts",
    )
    p.add_argument("--dataset-path", default=None, help="JSONL file for --dataset jsonl")
    p.add_argument("--num-prompts", type=positive_int, default=100, help="requests (agentic: sessions)")
    p.add_argument(
        "--max-concurrency",
        type=positive_int,
        default=None,
        help="most requests in flight (default: no limit)",
    )
    p.add_argument(
        "--request-rate", type=float, default=math.inf, help="requests/s, Poisson; inf = all at once"
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the workload and arrival times")
    p.add_argument("--random-input-len", type=positive_int, default=1024, help="prompt tokens per request")
    p.add_argument(
        "--random-output-len", type=positive_int, default=128, help="output tokens per request (also jsonl)"
    )
    p.add_argument(
        "--random-range-ratio", type=closed_fraction, default=1.0, help="lengths uniform in [len*ratio, len]"
    )
    p.add_argument(
        "--random-token-ids",
        action="store_true",
        help="send random token ids (exact input lengths; completions backend; vocab from the server)",
    )
    p.add_argument("--gsp-num-groups", type=positive_int, default=8, help="shared-prefix: groups")
    p.add_argument(
        "--gsp-prompts-per-group", type=positive_int, default=16, help="shared-prefix: prompts per group"
    )
    p.add_argument(
        "--gsp-system-prompt-len", type=positive_int, default=1024, help="shared-prefix: shared prefix tokens"
    )
    p.add_argument("--gsp-question-len", type=positive_int, default=64, help="shared-prefix: tokens after it")
    p.add_argument("--gsp-output-len", type=positive_int, default=128, help="shared-prefix: output tokens")
    p.add_argument("--agentic-turns", type=positive_int, default=4, help="agentic: turns per session")
    p.add_argument(
        "--agentic-system-len", type=positive_int, default=512, help="agentic: system prompt tokens"
    )
    p.add_argument(
        "--agentic-tool-output-len",
        type=positive_int,
        default=256,
        help="agentic: tool output tokens per turn",
    )
    p.add_argument(
        "--agentic-output-len", type=positive_int, default=64, help="agentic: output tokens per turn"
    )
    p.add_argument("--disable-ignore-eos", action="store_true", help="let requests stop at EOS")
    p.add_argument("--extra-request-body", default=None, help="JSON object merged into every request body")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--output-file", default=None, help="write the metrics (and the config) as JSON here")
    p.add_argument("--disable-progress", action="store_true", help="no progress bar")


def add_subcommands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the benchmark subcommands (``serve``, ``soak``) to a subparsers object."""
    from nibblekv.bench import soak

    _add_serve_args(add_command(sub, "serve", run, SERVE_HELP, SERVE_DESCRIPTION, SERVE_EPILOG))
    soak.add_soak_args(add_command(sub, "soak", soak.run, soak.HELP, soak.__doc__))


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``bench`` with its subcommands to the ``nibblekv`` CLI."""
    bench = subparsers.add_parser(
        "bench",
        help="load-test a running server (bench serve)",
        description="Benchmarks: 'bench serve' load-tests an OpenAI-compatible server.",
    )
    add_subcommands(bench.add_subparsers(dest="bench_command", required=True, metavar="COMMAND"))


def main(argv: list[str] | None = None) -> int:
    """``python -m nibblekv.bench serve ...``: the client alone, without the engine's imports (torch)."""
    from nibblekv.cli_style import Parser, use_help_formatter

    parser = Parser(prog="python -m nibblekv.bench", description="nibblekv benchmarks")
    add_subcommands(parser.add_subparsers(dest="bench_command", required=True, metavar="COMMAND"))
    use_help_formatter(parser)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


def _api_root(base_url: str) -> str:
    root = base_url.rstrip("/")
    return root if root.endswith("/v1") else root + "/v1"


def _server_facts(root: str, api_key: str | None) -> tuple[str | None, int | None]:
    """(first model name, vocabulary size) as the server reports them; None where it does not."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    model = vocab = None
    try:
        data = httpx.get(f"{root}/models", headers=headers, timeout=30).json().get("data") or []
        model = data[0]["id"] if data else None
        info = httpx.get(root.removesuffix("/v1") + "/get_model_info", headers=headers, timeout=30)
        vocab = info.json().get("vocab_size") if info.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        pass
    return model, vocab


def build_requests(args: argparse.Namespace, vocab_size: int | None) -> list[Any]:
    """The workload the flags describe."""
    from nibblekv.bench import datasets as ds

    if args.dataset == "random":
        vocab = vocab_size if args.random_token_ids else None
        return ds.random_requests(
            args.num_prompts,
            args.random_input_len,
            args.random_output_len,
            args.random_range_ratio,
            args.seed,
            vocab,
        )
    if args.dataset == "shared-prefix":
        groups = max(1, min(args.gsp_num_groups, args.num_prompts))
        per_group = max(1, math.ceil(args.num_prompts / groups))
        reqs = ds.shared_prefix_requests(
            groups,
            per_group,
            args.gsp_system_prompt_len,
            args.gsp_question_len,
            args.gsp_output_len,
            args.seed,
        )
        return reqs[: args.num_prompts]
    if args.dataset == "agentic":
        return ds.agentic_sessions(
            args.num_prompts,
            args.agentic_turns,
            args.agentic_system_len,
            args.agentic_tool_output_len,
            args.agentic_output_len,
            args.seed,
        )
    if not args.dataset_path:
        raise SystemExit("--dataset jsonl needs --dataset-path")
    return ds.jsonl_requests(args.dataset_path, args.num_prompts, args.random_output_len)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print the report, write JSON; exit 1 if every request failed."""
    from nibblekv.bench.client import Target
    from nibblekv.bench.runner import LoadShape, run_benchmark
    from nibblekv.bench.stats import format_report, summarize

    parser: argparse.ArgumentParser = args._parser
    if args.random_token_ids and args.backend == "chat":
        parser.error("--random-token-ids needs --backend completions")
    if args.dataset == "jsonl" and not args.dataset_path:
        parser.error("--dataset jsonl needs --dataset-path")
    try:
        extra = json.loads(args.extra_request_body) if args.extra_request_body else {}
    except json.JSONDecodeError as exc:
        parser.error(f"--extra-request-body is not valid JSON: {exc}")
    if not isinstance(extra, dict):
        parser.error("--extra-request-body must be a JSON object")
    root = _api_root(args.base_url)
    model, vocab = _server_facts(root, args.api_key)
    if args.random_token_ids and not vocab:
        raise SystemExit("--random-token-ids: the server does not report vocab_size at /get_model_info")
    target = Target(
        root,
        args.backend,
        args.model or model or "default",
        args.api_key,
        ignore_eos=not args.disable_ignore_eos,
        extra_body=extra,
    )
    requests = build_requests(args, vocab)
    shape = LoadShape(
        args.request_rate, args.max_concurrency, args.seed, args.timeout, not args.disable_progress
    )
    results, duration = asyncio.run(run_benchmark(target, requests, shape))
    metrics = summarize(results, duration)
    print(format_report(metrics, f"Serving Benchmark ({args.dataset})"), flush=True)
    if args.output_file:
        config = {k: v for k, v in vars(args).items() if k not in ("func", "_parser", "api_key")}
        config["request_rate"] = (
            None if math.isinf(args.request_rate) else args.request_rate
        )  # JSON has no inf
        payload = {"config": config, "model": target.model, **metrics}
        Path(args.output_file).write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
        print(f"wrote {args.output_file}", file=sys.stderr)
    return 0 if metrics["completed"] else 1
