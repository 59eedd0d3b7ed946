"""Evaluation text: where it lives, which file calibrates, and fixed token windows cut from the rest."""

from __future__ import annotations

from pathlib import Path

import torch

from nibblekv.model import Tokenizer

CALIBRATION_FILE: str = "northanger_abbey.txt"
# Shipped with the package: the opening chapters of four Austen novels (public domain, ~190 KB).
DEFAULT_DATA_DIR: Path = Path(__file__).resolve().parent / "texts"


def resolve_data_dir(path: str | Path | None) -> Path:
    """``--data-dir`` (default: the packaged Austen excerpts) -> an existing folder of ``*.txt``."""
    folder = Path(path) if path is not None else DEFAULT_DATA_DIR
    if not folder.is_dir() or not any(folder.glob("*.txt")):
        raise FileNotFoundError(
            f"no evaluation text in {folder.resolve()}: pass --data-dir pointing at a folder of *.txt "
            f"({CALIBRATION_FILE} is used for calibration, the others for evaluation)"
        )
    return folder


def calibration_text(data_dir: Path) -> str:
    path = data_dir / CALIBRATION_FILE
    if not path.is_file():
        raise FileNotFoundError(f"calibration text {path} is missing")
    return path.read_text(encoding="utf-8")


def eval_texts(data_dir: Path) -> list[tuple[str, str]]:
    """``(file name, text)`` of every ``*.txt`` except the calibration text, sorted by name."""
    out = [
        (p.name, p.read_text(encoding="utf-8"))
        for p in sorted(data_dir.glob("*.txt"))
        if p.name != CALIBRATION_FILE
    ]
    if not out:
        raise FileNotFoundError(f"{data_dir} holds no evaluation text besides {CALIBRATION_FILE}")
    return out


def token_windows(
    tokenizer: Tokenizer, texts: list[tuple[str, str]], num_windows: int, length: int
) -> torch.Tensor:
    """``num_windows`` windows of ``length`` tokens: int64 ``[num_windows, length]``.

    Windows go round-robin over the texts and, within a text, sit at evenly spaced offsets that skip
    its very start and end (title pages), never overlapping. No special tokens are added (SmolLM2's
    tokenizer adds none either), so a window is plain running text from its first token.
    """
    if num_windows < 1 or length < 2:
        raise ValueError("need num_windows >= 1 and length >= 2")
    per_text = [len(range(i, num_windows, len(texts))) for i in range(len(texts))]
    rows: list[list[int]] = []
    pieces: dict[int, list[list[int]]] = {}
    for t, ((name, text), n) in enumerate(zip(texts, per_text)):
        if n == 0:
            continue
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) < (n + 1) * length:
            raise ValueError(f"{name} has {len(ids)} tokens, too few for {n} windows of {length}")
        stride = len(ids) // (n + 1)  # >= length, so windows never overlap
        pieces[t] = [ids[stride // 2 + j * stride : stride // 2 + j * stride + length] for j in range(n)]
    for i in range(num_windows):
        t = i % len(texts)
        rows.append(pieces[t][i // len(texts)])
    return torch.tensor(rows, dtype=torch.int64)
