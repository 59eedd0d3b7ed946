"""The lm-eval recipe in docs/serving.md, run as written (offline) against the test server: lm-eval's
``local-completions`` model, the tokenizer the server exported, the task shipped in the repository."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from server_harness import TOKENIZER_DIR, ServerProcess

pytestmark = pytest.mark.slow
pytest.importorskip("lm_eval")

ROOT = Path(__file__).resolve().parents[1]
DOC_URL = "http://127.0.0.1:30000"
DOC_TOKENIZER = "/tmp/nibblekv-tokenizer"


def documented_command() -> str:
    """The ``lm_eval`` command of the lm-eval section in docs/serving.md (continuation lines joined)."""
    text = (ROOT / "docs" / "serving.md").read_text()
    section = text[text.index("## Scoring a KV dtype with lm-eval") :]
    block = section[section.index("```bash") : section.index("```", section.index("```bash") + 7)]
    joined = block.replace("\\\n", " ")
    commands = [line.strip() for line in joined.splitlines() if line.strip().startswith("lm_eval ")]
    assert len(commands) == 1, commands
    return commands[0]


def test_documented_lm_eval_command_scores_offline(smollm2_server: ServerProcess) -> None:
    command = documented_command()
    assert DOC_URL in command and DOC_TOKENIZER in command
    assert (TOKENIZER_DIR / "tokenizer.json").is_file(), "the server did not export its tokenizer"
    command = command.replace(DOC_URL, smollm2_server.url).replace(DOC_TOKENIZER, str(TOKENIZER_DIR))
    argv = shlex.split(command)
    argv[0:1] = [sys.executable, "-m", "lm_eval"]  # the `lm_eval` script of this interpreter
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    run = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    row = re.search(r"\|nibblekv_facts\s*\|.*?\|acc\s*\|[^|]*\|\s*([0-9.]+)\s*\|", out)
    assert row, out[-3000:]
    # 32 four-way questions: chance is 0.25; broken prompt logprobs score near it, the model ~0.7
    assert float(row.group(1)) >= 0.5, out[-2000:]
