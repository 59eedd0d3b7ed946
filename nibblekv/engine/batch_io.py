"""The JSONL files of ``nibblekv generate --input-jsonl / --output-jsonl``: schema checks and resuming.

Input lines: ``{"prompt": str}``, ``{"messages": [{"role": ..., "content": ...}, ...]}`` or
``{"input_ids": [int, ...]}``, each with an optional ``"id"`` (default: the line's index from 0) and
``"sampling_params"`` overriding the sampling flags. Output lines: ``{"id", "text", "finish_reason",
"prompt_tokens", "completion_tokens"}`` (and ``"logprobs"`` when asked), appended as each request
finishes; on a rerun, ids already in the output are skipped. The whole input is checked before the
engine starts, so a bad line costs no model load and touches no output.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from nibblekv.engine.sampling_params import SamplingParams

PROMPT_KEYS: tuple[str, ...] = ("prompt", "messages", "input_ids")
ROW_KEYS: frozenset[str] = frozenset({"id", "sampling_params", *PROMPT_KEYS})
INPUT_HELP: str = (
    'one JSON object per line: {"prompt": "..."}, {"messages": [{"role": "user", "content": "..."}]} or '
    '{"input_ids": [1, 2, ...]}, each with an optional "id" (default: the line\'s index from 0) and '
    '"sampling_params" (e.g. {"max_new_tokens": 64, "temperature": 0.7}) overriding the sampling flags'
)
OUTPUT_HELP: str = (
    'results, one JSON object per line as each request finishes: {"id", "text", "finish_reason", '
    '"prompt_tokens", "completion_tokens"} (+ "logprobs" with --logprobs); appended to, and ids already '
    "in it are skipped, so rerunning the same command after an interruption resumes"
)


class BatchFileError(ValueError):
    """A batch file that does not follow the schema; the message names the file and line."""


class Job(NamedTuple):
    """One input row, checked."""

    id: str
    row: dict[str, Any]
    params: SamplingParams
    where: str  # "file:line", for errors found once the model is loaded


def read_jobs(path: Path, params: SamplingParams) -> list[Job]:
    """Every row of the input file, checked against the schema; raises :class:`BatchFileError`."""
    if not path.is_file():
        raise BatchFileError(f"--input-jsonl {path}: no such file")
    jobs: list[Job] = []
    first_line: dict[str, int] = {}
    with path.open("rb") as f:
        for n, raw in enumerate(f):
            where = f"{path}:{n + 1}"
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise BatchFileError(f"{where}: not UTF-8 text") from None
            if not line:
                continue
            rid, row, sp = _check_row(where, line, n, params)
            if rid in first_line:
                raise BatchFileError(f"{where}: id {rid!r} repeats line {first_line[rid]}")
            first_line[rid] = n + 1
            jobs.append(Job(rid, row, sp, where))
    return jobs


def _check_row(
    where: str, line: str, n: int, params: SamplingParams
) -> tuple[str, dict[str, Any], SamplingParams]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise BatchFileError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise BatchFileError(f"{where}: a line must be a JSON object, got {type(row).__name__}")
    unknown = sorted(set(row) - ROW_KEYS)
    if unknown:
        raise BatchFileError(f"{where}: unknown key(s) {unknown}; a row has {sorted(ROW_KEYS)}")
    given = [k for k in PROMPT_KEYS if k in row]
    if len(given) != 1:
        raise BatchFileError(
            f"{where}: a row needs exactly one of {list(PROMPT_KEYS)}, got {given or 'none of them'}"
        )
    problem = _prompt_problem(given[0], row[given[0]])
    if problem:
        raise BatchFileError(f"{where}: {problem}")
    rid = row.get("id", n)
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise BatchFileError(f'{where}: "id" must be a string or an integer')
    overrides = row.get("sampling_params", {})
    if not isinstance(overrides, dict):
        raise BatchFileError(f'{where}: "sampling_params" must be a JSON object')
    try:
        sp = replace(params, **overrides)
    except TypeError:
        known = sorted(f for f in SamplingParams.__dataclass_fields__ if not f.startswith("_"))
        bad = sorted(set(overrides) - set(known))
        raise BatchFileError(f"{where}: unknown sampling_params {bad}; known: {known}") from None
    except ValueError as exc:
        raise BatchFileError(f"{where}: sampling_params: {exc}") from None
    return str(rid), row, sp


def _prompt_problem(key: str, value: Any) -> str | None:
    if key == "prompt":
        return None if isinstance(value, str) else '"prompt" must be a string'
    if key == "input_ids":
        ok = isinstance(value, list) and value and all(type(t) is int and t >= 0 for t in value)
        return None if ok else '"input_ids" must be a non-empty list of token ids (integers >= 0)'
    ok = isinstance(value, list) and value and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in value
    )
    return None if ok else '"messages" must be a non-empty list of {"role": ..., "content": ...} objects'


def done_ids(path: Path) -> set[str]:
    """Ids already in the output file. A torn last line (killed mid-write) is cut off so appends stay
    valid JSONL; any other line that is not a result row is an error, and the file is left as it is."""
    if not path.exists():
        return set()
    if not path.is_file():
        raise BatchFileError(f"--output-jsonl {path}: not a file")
    data = path.read_bytes()
    lines = data.split(b"\n")  # the last item is b"" when the file ends with a newline
    done: set[str] = set()
    good_bytes = 0
    for n, raw in enumerate(lines[:-1]):
        try:
            done.add(str(json.loads(raw)["id"]))
        except (ValueError, KeyError, TypeError):
            raise BatchFileError(
                f"--output-jsonl {path}:{n + 1}: not a result row of nibblekv generate; "
                "not appending to it (pass a new file or this batch's own output)"
            ) from None
        good_bytes += len(raw) + 1
    if good_bytes < len(data):
        with path.open("r+b") as f:
            f.truncate(good_bytes)
    return done
