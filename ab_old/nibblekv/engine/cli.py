"""``nibblekv generate``: prompts in, text out; or a JSONL batch, resumable, with a progress bar.

Batch input lines: ``{"prompt": str}`` or ``{"messages": [...]}`` or ``{"input_ids": [...]}``, each with
an optional ``"id"`` (default: the line number) and ``"sampling_params"`` overriding the flags. Output
lines: ``{"id", "text", "finish_reason", "prompt_tokens", "completion_tokens"}``, written as each
request finishes; on restart, ids already in the output file are skipped.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nibblekv.config import add_engine_args, config_from_args_or_exit


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("generate", help="generate text offline (bundled SmolLM2 by default)")
    p.add_argument("prompts", nargs="*", help="prompt text(s)")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template to each prompt")
    p.add_argument("--input-jsonl", type=Path, default=None)
    p.add_argument("--output-jsonl", type=Path, default=None)
    add_engine_args(p)
    s = p.add_argument_group("sampling")
    s.add_argument("--max-new-tokens", type=int, default=128)
    s.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--top-k", type=int, default=-1)
    s.add_argument("--min-p", type=float, default=0.0)
    s.add_argument("--repetition-penalty", type=float, default=1.0)
    s.add_argument("--frequency-penalty", type=float, default=0.0)
    s.add_argument("--presence-penalty", type=float, default=0.0)
    s.add_argument("--sampling-seed", type=int, default=None)
    s.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    s.add_argument("--stop-token-ids", type=int, nargs="+", default=[])
    s.add_argument("--ignore-eos", action="store_true")
    s.add_argument("--logprobs", type=int, default=None, help="top-n logprobs per generated token (JSONL)")
    p.set_defaults(func=run, _parser=p)


def _sampling_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "frequency_penalty": args.frequency_penalty,
        "presence_penalty": args.presence_penalty,
        "seed": args.sampling_seed,
        "stop": tuple(args.stop),
        "stop_token_ids": tuple(args.stop_token_ids),
        "ignore_eos": args.ignore_eos,
        "logprobs": args.logprobs,
    }


def run(args: argparse.Namespace) -> int:
    from nibblekv.engine.sampling_params import SamplingParams

    parser: argparse.ArgumentParser = args._parser
    config = config_from_args_or_exit(parser, args)
    try:
        params = SamplingParams(**_sampling_kwargs(args))
    except ValueError as exc:
        parser.error(str(exc))
    if bool(args.input_jsonl) != bool(args.output_jsonl):
        parser.error("--input-jsonl and --output-jsonl go together")
    if not args.prompts and not args.input_jsonl:
        parser.error("give prompt text(s) or --input-jsonl/--output-jsonl")
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", stream=sys.stderr)
    from nibblekv.engine.engine import Engine

    from nibblekv.engine.gc_heap import frozen_heap

    engine = Engine(config)
    start = time.perf_counter()
    with frozen_heap():
        if args.input_jsonl:
            tokens = _run_batch(engine, args, params)
        else:
            prompts = [_chat(engine, p) if args.chat else p for p in args.prompts]
            outs = engine.generate(prompts, params)
            for i, out in enumerate(outs):
                print(out.text if len(outs) == 1 else f"[{i}] {out.text}", flush=True)
            tokens = sum(o.completion_tokens for o in outs)
    _summary(engine, tokens, time.perf_counter() - start)
    return 0


def _chat(engine: Any, text: str) -> list[int]:
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": text}])


def _summary(engine: Any, tokens: int, seconds: float) -> None:
    spec = engine.pool.spec
    tail = f" (+{spec.tail_tokens} tail)" if spec.tail_tokens else ""
    print(
        f"[summary] tokens: {tokens}, seconds: {seconds:.2f}, tokens/s: {tokens / max(seconds, 1e-9):.1f}, "
        f"KV dtype: {spec.kv_dtype.value}, resident-token capacity: {spec.max_total_num_tokens}{tail}",
        file=sys.stderr,
        flush=True,
    )


def _done_ids(path: Path) -> set[str]:
    """Ids already written; a torn last line (killed mid-write) is cut off so appends stay valid JSONL."""
    if not path.exists():
        return set()
    done: set[str] = set()
    good_bytes = 0
    with path.open("rb") as f:
        for raw in f:
            try:
                done.add(str(json.loads(raw)["id"]))
            except (ValueError, KeyError):
                break
            good_bytes += len(raw)
    if good_bytes < path.stat().st_size:
        with path.open("r+b") as f:
            f.truncate(good_bytes)
    return done


def _read_jobs(path: Path, params: Any, done: set[str]) -> list[tuple[str, dict[str, Any], Any]]:
    """(id, row, sampling params) of every input line not yet in the output."""
    from dataclasses import replace

    jobs = []
    for n, line in enumerate(path.read_text().splitlines()):
        if line.strip():
            row = json.loads(line)
            rid = str(row.get("id", n))
            if rid not in done:
                jobs.append((rid, row, replace(params, **row.get("sampling_params", {}))))
    return jobs


def _prompt_of(engine: Any, row: dict[str, Any], chat: bool) -> str | list[int]:
    if "input_ids" in row:
        return [int(t) for t in row["input_ids"]]
    if "messages" in row:
        return engine.tokenizer.apply_chat_template(row["messages"])
    return _chat(engine, row["prompt"]) if chat else row["prompt"]


def _run_batch(engine: Any, args: argparse.Namespace, params: Any) -> int:
    from tqdm import tqdm

    out_path: Path = args.output_jsonl
    jobs = _read_jobs(args.input_jsonl, params, _done_ids(out_path))
    for rid, row, sp in jobs:
        engine.add_request(_prompt_of(engine, row, args.chat), sp, request_id=rid)
    tokens = 0
    with out_path.open("a") as f, tqdm(total=len(jobs), desc="generate", unit="req", file=sys.stderr) as bar:
        while engine.has_unfinished():
            for out in engine.step():
                if not out.finished:
                    continue
                row = {
                    "id": out.request_id,
                    "text": out.text,
                    "finish_reason": out.finish_reason,
                    "prompt_tokens": out.prompt_tokens,
                    "completion_tokens": out.completion_tokens,
                }
                if out.logprobs is not None:
                    row["logprobs"] = [asdict(lp) for lp in out.logprobs]
                # NOTE: one write + flush + fsync per line, so Ctrl-C loses only unfinished requests.
                f.write(json.dumps(row) + "\n")
                f.flush()
                os.fsync(f.fileno())
                tokens += out.completion_tokens
                bar.update(1)
    return tokens
