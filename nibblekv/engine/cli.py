"""``nibblekv generate``: prompts in, text out; or a JSONL batch, resumable, with a progress bar.

The batch files' schema and resuming are in :mod:`nibblekv.engine.batch_io`. Bad input (a model that
cannot load, a malformed batch line) is refused with ``parser.error`` (exit 2) before the engine starts;
Ctrl-C exits 130 with one line saying how far the batch got.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nibblekv.cli_style import add_command
from nibblekv.config import EngineConfig, add_engine_args
from nibblekv.engine.batch_io import INPUT_HELP, OUTPUT_HELP, BatchFileError, Job, done_ids, read_jobs
from nibblekv.engine.long_context import context_length_cli_error

# the numeric SamplingParams fields that are flags of the same name: (the flag's default, its help)
SAMPLING_FLAGS: dict[str, tuple[int | float, str]] = {
    "max_new_tokens": (128, "tokens to generate per request"),
    "min_new_tokens": (0, "no EOS, stop token or stop string ends a request before this many"),
    "temperature": (0.0, "0 = greedy"),
    "top_p": (1.0, "nucleus sampling; 1 = off"),
    "top_k": (-1, "-1 = off"),
    "min_p": (0.0, "0 = off"),
    "repetition_penalty": (1.0, "HF's; 1 = off"),
    "frequency_penalty": (0.0, "OpenAI's; 0 = off"),
    "presence_penalty": (0.0, "OpenAI's; 0 = off"),
}
HELP = "generate text offline from prompts or a JSONL batch (default model: the bundled SmolLM2)"
DESCRIPTION = (
    "Generate text offline, without a server: from prompts given on the command line, or from a JSONL "
    "batch (--input-jsonl) whose results are appended to --output-jsonl as they finish; rerunning an "
    "interrupted batch resumes it. The model defaults to the bundled SmolLM2-135M-Instruct."
)
EPILOG = """examples:
  nibblekv generate "The capital of France is" --max-new-tokens 16
  nibblekv generate --chat "Write a haiku about the sea." --kv-cache-dtype nvfp4
  nibblekv generate --model /models/Llama-3.1-8B-Instruct --input-jsonl in.jsonl --output-jsonl out.jsonl

in.jsonl, one request per line:
  {"id": "q1", "prompt": "Once upon a time", "sampling_params": {"max_new_tokens": 32}}
  {"messages": [{"role": "user", "content": "Name three primes."}]}
  {"input_ids": [1, 2, 3]}"""


def config_from_args_or_exit(parser: argparse.ArgumentParser, args: argparse.Namespace) -> EngineConfig:
    """:meth:`EngineConfig.from_args`, turning a bad combination into ``parser.error`` (exit 2)."""
    try:
        config = EngineConfig.from_args(args).with_local_model()  # NOTE: fetches a Hub --model first
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits
    from nibblekv.engine.setup import state_slots_error  # NOTE: torch; the CLI's --help stays light

    problem = context_length_cli_error(config) or state_slots_error(config)  # NOTE: before any weights load
    if problem:
        parser.error(problem)
    return config


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(subparsers, "generate", run, HELP, DESCRIPTION, EPILOG)
    p.add_argument("prompts", nargs="*", help="prompt text(s); each is one request")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template to each prompt")
    p.add_argument("--input-jsonl", type=Path, default=None, metavar="FILE", help=INPUT_HELP)
    p.add_argument("--output-jsonl", type=Path, default=None, metavar="FILE", help=OUTPUT_HELP)
    add_engine_args(p)
    s = p.add_argument_group("sampling")
    for name, (default, help_text) in SAMPLING_FLAGS.items():
        s.add_argument("--" + name.replace("_", "-"), type=type(default), default=default, help=help_text)
    s.add_argument(
        "--sampling-seed",
        type=int,
        default=None,
        help="per-request seed: the same tokens whatever the batch (default: --seed's shared stream)",
    )
    s.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    s.add_argument("--stop-token-ids", type=int, nargs="+", default=[], help="token ids that end a request")
    s.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")
    s.add_argument(
        "--logprobs", type=int, default=None, help="top-n logprobs per generated token (in --output-jsonl)"
    )


def _sampling_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in SAMPLING_FLAGS} | {
        "seed": args.sampling_seed,
        "stop": tuple(args.stop),
        "stop_token_ids": tuple(args.stop_token_ids),
        "ignore_eos": args.ignore_eos,
        "logprobs": args.logprobs,
    }


@dataclass
class _Batch:
    """A batch run: the input rows not yet in the output, and what the Ctrl-C line counts."""

    jobs: list[Job]
    ids: frozenset[str]  # of every input row
    written: int  # input rows in the output file when the run started

    def rows_done(self, out: Path) -> int:
        """Input rows in the output file now (read back: a Ctrl-C may land between a write and a count)."""
        try:
            return len(self.ids & done_ids(out))
        except BatchFileError:
            return self.written


def run(args: argparse.Namespace) -> int:
    from nibblekv.engine.sampling_params import SamplingParams
    from nibblekv.model.source import model_source_error

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
    problem = model_source_error(config.model, config.load_format, bool(config.json_model_override_args))
    if problem:
        parser.error(problem)
    batch = _load_batch(parser, args, params) if args.input_jsonl else None
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", stream=sys.stderr)
    try:
        return _generate(config, args, params, batch)
    except BatchFileError as exc:  # a row the loaded model refuses (e.g. too long); nothing was run
        parser.error(str(exc))
    except KeyboardInterrupt:
        where = ""
        if batch is not None:
            where = (
                f": {batch.rows_done(args.output_jsonl)} of {len(batch.ids)} rows are done in "
                f"{args.output_jsonl}; rerun the same command (same --output-jsonl) to resume with the rest"
            )
        print(f"{parser.prog}: interrupted{where}", file=sys.stderr, flush=True)
        return 130  # 128 + SIGINT, as a shell reports it


def _load_batch(parser: argparse.ArgumentParser, args: argparse.Namespace, params: Any) -> _Batch:
    """The input checked line by line and the output's finished ids, before any model loads."""
    out: Path = args.output_jsonl
    if not out.parent.is_dir():
        parser.error(f"--output-jsonl {out}: folder {out.parent} does not exist")
    try:
        jobs = read_jobs(args.input_jsonl, params)
        done = done_ids(out)
    except BatchFileError as exc:
        parser.error(str(exc))
    todo = [job for job in jobs if job.id not in done]
    return _Batch(todo, frozenset(job.id for job in jobs), len(jobs) - len(todo))


def _generate(config: Any, args: argparse.Namespace, params: Any, batch: _Batch | None) -> int:
    from nibblekv.engine.engine import Engine
    from nibblekv.engine.gc_heap import frozen_heap

    engine = Engine(config)
    try:
        start = time.perf_counter()
        with frozen_heap():
            if batch is not None:
                tokens = _run_batch(engine, args, batch)
            else:
                prompts = [_chat(engine, p) if args.chat else p for p in args.prompts]
                outs = engine.generate(prompts, params)
                for i, out in enumerate(outs):
                    print(out.text if len(outs) == 1 else f"[{i}] {out.text}", flush=True)
                tokens = sum(o.completion_tokens for o in outs)
        _summary(engine, tokens, time.perf_counter() - start)
    finally:
        engine.shutdown()
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


def _prompt_of(engine: Any, row: dict[str, Any], chat: bool) -> str | list[int]:
    if "input_ids" in row:
        return [int(t) for t in row["input_ids"]]
    if "messages" in row:
        return engine.tokenizer.apply_chat_template(row["messages"])
    return _chat(engine, row["prompt"]) if chat else row["prompt"]


def _run_batch(engine: Any, args: argparse.Namespace, batch: _Batch) -> int:
    from tqdm import tqdm

    out_path: Path = args.output_jsonl
    requests = []
    for job in batch.jobs:  # every row is checked against the model before any runs
        try:
            requests.append(engine.make_request(_prompt_of(engine, job.row, args.chat), job.params, job.id))
        except Exception as exc:  # noqa: BLE001 -- jinja2's TemplateError and friends are the row's too
            raise BatchFileError(f"{job.where}: {exc}") from None
    for request in requests:
        engine.enqueue(request)
    tokens = 0
    bar = tqdm(total=len(batch.ids), initial=batch.written, desc="generate", unit="req", file=sys.stderr)
    with out_path.open("a") as f, bar:
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
