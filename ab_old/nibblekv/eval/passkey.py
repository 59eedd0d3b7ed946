"""Long-context passkey retrieval: a number hidden at several depths of filler, then asked for.

Prompts are built in token space so each is exactly ``length`` tokens: an instruction, repeated
filler sentences with the key sentence inserted at ``depth`` (0 = start, 1 = end of the filler),
then the question ``What is the pass key? The pass key is``. The model's greedy continuation is a
hit when it contains the key's digits. Prompts run through :class:`PagedRunner` as the engine runs
them: chunked prefill (``chunk`` tokens per step, the engine's default 2048), then decode steps.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nibblekv.eval.configs import KVConfig
from nibblekv.eval.paged_runner import PagedRunner
from nibblekv.model import CausalLM, Tokenizer

INTRO = (
    "There is an important piece of information hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about it.\n"
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
KEY_SENTENCE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "\nWhat is the pass key? The pass key is"


@dataclass(frozen=True)
class PasskeyCase:
    length: int
    depth: float
    key: int
    prompt: tuple[int, ...]


def build_case(tokenizer: Tokenizer, length: int, depth: float, key: int) -> PasskeyCase:
    """A prompt of exactly ``length`` tokens with ``key`` at ``depth`` in [0, 1] of the filler."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")

    def enc(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    intro, needle, question, unit = enc(INTRO), enc(KEY_SENTENCE.format(key=key)), enc(QUESTION), enc(FILLER)
    budget = length - len(intro) - len(needle) - len(question)
    if budget < len(unit):
        raise ValueError(f"length {length} leaves no room for filler")
    filler = (unit * (budget // len(unit) + 1))[:budget]
    # The needle goes at a sentence boundary of the filler, nearest the asked depth.
    cut = round(depth * (budget // len(unit))) * len(unit)
    prompt = intro + filler[:cut] + needle + filler[cut:] + question
    assert len(prompt) == length
    return PasskeyCase(length, depth, key, tuple(prompt))


def make_cases(
    tokenizer: Tokenizer, lengths: Sequence[int], depths: Sequence[float], seed: int = 0
) -> list[PasskeyCase]:
    """One case per (length, depth), each with its own 5-digit key from a seeded generator."""
    rng = random.Random(seed)
    return [build_case(tokenizer, n, d, rng.randrange(10000, 100000)) for n in lengths for d in depths]


@dataclass(frozen=True)
class PasskeyResult:
    config: str
    length: int
    depth: float
    key: int
    hit: bool
    output: str


@torch.inference_mode()
def run_passkey(
    model: CausalLM,
    tokenizer: Tokenizer,
    config: KVConfig,
    cases: Sequence[PasskeyCase],
    *,
    global_scales: torch.Tensor | None = None,
    chunk: int = 2048,
    new_tokens: int = 8,
) -> list[PasskeyResult]:
    """Greedy-generate ``new_tokens`` for every case of one length at once (one batch per length)."""
    results: list[PasskeyResult] = []
    for length in sorted({c.length for c in cases}):
        group = [c for c in cases if c.length == length]
        runner = PagedRunner(
            model,
            config,
            max_requests=len(group),
            max_len=length + new_tokens,
            global_scales=global_scales,
            prefill_chunk=chunk,
        )
        runner.start(len(group))
        hidden = torch.empty(0)
        for c0 in range(0, length, chunk):
            hidden = runner.step([c.prompt[c0 : c0 + chunk] for c in group], c0 + chunk < length)
        rows = len(group[0].prompt[c0 : c0 + chunk])
        last = hidden.view(len(group), rows, -1)[:, -1]
        out: list[list[int]] = [[] for _ in group]
        for step in range(new_tokens):
            nxt = model.compute_logits(last).argmax(-1).tolist()
            for o, t in zip(out, nxt):
                o.append(int(t))
            if step + 1 < new_tokens:
                last = runner.step([[t] for t in nxt])
        runner.release()
        for c, ids in zip(group, out):
            text = tokenizer.decode(ids)
            results.append(
                PasskeyResult(
                    config.name, c.length, c.depth, c.key, str(c.key) in text.replace(" ", ""), text
                )
            )
    return results
