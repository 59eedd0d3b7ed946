"""The ``nibblekv_facts`` lm-eval task's data: ``nibblekv_facts.jsonl`` next to this file, read locally."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("nibblekv_facts.jsonl")


def load(**_: Any) -> Any:
    """The task's one split, ``test``, as a ``datasets.DatasetDict`` (no Hub access)."""
    import datasets

    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
