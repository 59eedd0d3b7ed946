"""Benchmark workloads: random, generated shared-prefix, multi-turn agentic sessions, JSONL prompts.

Pure Python (no tokenizer, no torch): text prompts are made of common English words, about one
token each in BPE vocabularies, and the token counts reported are the server's own (``usage``).
Random prompts can instead be raw token ids (exact lengths) when the vocabulary size is known.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Common words that are single tokens in Llama / GPT-2 / SmolLM2 style BPE vocabularies (with a space).
_WORD_TEXT = """
the of and to in is was for on that with as by at from his her it an were are which this be or had
not but have one their they all there been has when who will more if no out so said what up its
about into than them can only other new some time could these two may then do first any my now such
like our over man me even most made after also did many before must through back years where much
your way well down should because each just those people how too little state good very make world
still own see men work long get here between both life being under never day same another know
while last might us great old year off come since against go came right used take three states
himself few house use during without again place around however home small found thought went say
part once general high upon school every don does got united left number course war until always
away something fact though water less public put think almost hand enough far took head yet
government system better set told nothing night end why called didn find look asked later knew
point next program city business give group toward young days let room
"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())


@dataclass
class BenchRequest:
    """One request: a prompt (text, token ids or chat messages) and how many tokens to generate."""

    prompt: str | list[int] | list[dict[str, str]]
    output_len: int
    session: int | None = None  # agentic: which session this turn belongs to
    turn: int = 0
    tool_outputs: list[str] = field(default_factory=list)  # agentic: the new input of each later turn


def words(rng: random.Random, count: int) -> str:
    """``count`` random words joined by spaces."""
    return " ".join(rng.choice(WORDS) for _ in range(max(0, count)))


def _length(rng: random.Random, target: int, range_ratio: float) -> int:
    """A length in ``[target * range_ratio, target]`` (``range_ratio`` 1 = fixed)."""
    low = max(1, int(target * range_ratio))
    return rng.randint(low, max(low, target))


def random_requests(
    num: int, input_len: int, output_len: int, range_ratio: float, seed: int, vocab_size: int | None = None
) -> list[BenchRequest]:
    """Independent prompts; token ids in ``[100, vocab_size)`` when ``vocab_size`` is given, else words."""
    rng = random.Random(seed)
    out = []
    for _ in range(num):
        n_in, n_out = _length(rng, input_len, range_ratio), _length(rng, output_len, range_ratio)
        # Ids below 100 hold most special tokens in common vocabularies; avoid them.
        prompt: str | list[int] = (
            [rng.randrange(100, vocab_size) for _ in range(n_in)]
            if vocab_size and vocab_size > 100
            else words(rng, n_in)
        )
        out.append(BenchRequest(prompt, n_out))
    return out


def shared_prefix_requests(
    num_groups: int, prompts_per_group: int, system_len: int, question_len: int, output_len: int, seed: int
) -> list[BenchRequest]:
    """Groups of prompts sharing a long system prefix (prefix-cache and cache-aware routing load)."""
    rng = random.Random(seed)
    out = []
    for g in range(num_groups):
        system = f"System prompt {g}: " + words(rng, system_len)
        for q in range(prompts_per_group):
            out.append(
                BenchRequest(f"{system}\n\nQuestion {q}: {words(rng, question_len)}\nAnswer:", output_len)
            )
    rng.shuffle(out)
    return out


def agentic_sessions(
    num_sessions: int, turns: int, system_len: int, tool_output_len: int, output_len: int, seed: int
) -> list[BenchRequest]:
    """Multi-turn sessions: each later turn resends the whole history plus a new tool output.

    Returns one :class:`BenchRequest` per session (its first turn); ``tool_outputs`` holds the
    inputs of the following turns, which the runner sends after each reply arrives.
    """
    rng = random.Random(seed)
    sessions = []
    for s in range(num_sessions):
        messages = [
            {
                "role": "system",
                "content": f"You are agent {s}. Tools: search, read, run. " + words(rng, system_len),
            },
            {"role": "user", "content": "Task: " + words(rng, 32)},
        ]
        tool_outputs = [f"[tool output {t}]\n" + words(rng, tool_output_len) for t in range(1, turns)]
        sessions.append(BenchRequest(messages, output_len, session=s, tool_outputs=tool_outputs))
    return sessions


def jsonl_requests(path: str | Path, num: int | None, default_output_len: int) -> list[BenchRequest]:
    """Lines of ``{"prompt": str}`` or ``{"messages": [...]}``, optional ``output_len`` / ``max_tokens``."""
    out = []
    for line_no, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row: dict[str, Any] = json.loads(line)
        prompt = row.get("messages", row.get("prompt"))
        if not isinstance(prompt, str | list) or not prompt:
            raise ValueError(f"{path}:{line_no}: needs a non-empty 'prompt' string or 'messages' list")
        output_len = int(row.get("output_len", row.get("max_tokens", default_output_len)))
        out.append(BenchRequest(prompt, output_len))
        if num is not None and len(out) >= num:
            break
    return out


def as_messages(prompt: str | list[int] | list[dict[str, str]]) -> list[dict[str, str]]:
    """A prompt as chat messages (token ids cannot be; callers use text prompts for chat)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if prompt and isinstance(prompt[0], dict):
        return list(prompt)  # type: ignore[arg-type]
    raise ValueError("token-id prompts need the completions backend")


def as_text(prompt: str | list[int] | list[dict[str, str]]) -> str | list[int]:
    """A prompt for ``/v1/completions``: messages are flattened as ``role: content`` lines."""
    if isinstance(prompt, str):
        return prompt
    if prompt and isinstance(prompt[0], dict):
        return "".join(f"{m['role']}: {m['content']}\n" for m in prompt) + "assistant:"  # type: ignore[index]
    return list(prompt)  # type: ignore[arg-type]
