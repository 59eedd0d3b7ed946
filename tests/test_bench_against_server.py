"""``nibblekv bench serve`` against the real SmolLM2 server: token counts come from its usage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from server_harness import ServerProcess

pytestmark = pytest.mark.slow


def _bench(server: ServerProcess, out: Path, *args: str) -> dict[str, object]:
    cmd = [sys.executable, "-m", "nibblekv.bench", "serve", "--base-url", server.url, "--disable-progress",
           "--output-file", str(out), *args]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Output token throughput (tok/s)" in proc.stdout
    report: dict[str, object] = json.loads(out.read_text())
    return report


def test_random_token_ids_give_exact_lengths(smollm2_server: ServerProcess, tmp_path: Path) -> None:
    report = _bench(smollm2_server, tmp_path / "random.json", "--dataset", "random", "--random-token-ids",
                    "--num-prompts", "8", "--random-input-len", "24", "--random-output-len", "3",
                    "--max-concurrency", "8")  # fmt: skip
    assert report["completed"] == 8 and report["failed"] == 0
    assert report["total_input_tokens"] == 8 * 24 and report["total_output_tokens"] == 8 * 3
    assert report["model"] == "SmolLM2-135M-Instruct"


def test_agentic_chat_sessions(smollm2_server: ServerProcess, tmp_path: Path) -> None:
    report = _bench(smollm2_server, tmp_path / "agentic.json", "--backend", "chat", "--dataset", "agentic",
                    "--num-prompts", "2", "--agentic-turns", "3", "--agentic-system-len", "16",
                    "--agentic-tool-output-len", "16", "--agentic-output-len", "2")  # fmt: skip
    assert report["completed"] == 6 and report["total_output_tokens"] == 12
    assert float(report["mean_ttft_ms"]) > 0 and float(report["p99_e2e_latency_ms"]) > 0  # type: ignore[arg-type]
