"""``--model org/name``: Hugging Face Hub models fetched through ``huggingface_hub`` (offline here: a Hub
cache laid out on disk, as a download leaves it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import huggingface_hub
import pytest
from model_helpers import TINY_LLAMA

from nibblekv.config import EngineConfig
from nibblekv.model.hub import HubFetchError, fetch, is_hub_id

REPO = Path(__file__).resolve().parents[1]


def _hub_cache(root: Path, repo: str, files: dict[str, str]) -> Path:
    """A Hub cache holding ``repo``'s main revision with ``files``, as ``hf download`` leaves one."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    return snapshot


def _cli(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    cmd = [sys.executable, "-m", "nibblekv", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("model", "hub"),
    [
        ("Qwen/Qwen3-8B", True),
        ("meta-llama/Llama-3.1-8B-Instruct", True),
        ("./models/x", False),
        ("/models/x", False),
        ("a/b/c", False),
        ("llama-3.1-8b", False),
        ("org/model.gguf", False),
        ("org/", False),
    ],
)
def test_what_reads_as_a_hub_id(model: str, hub: bool) -> None:
    assert is_hub_id(model) is hub


def test_fetch_asks_for_what_the_loader_reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    (tmp_path / "config.json").write_text("{}")

    def fake(**kwargs: Any) -> str:
        calls.append(kwargs)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    assert fetch("org/name", "v1", "/cache") == tmp_path
    assert fetch("org/name", weights=False) == tmp_path
    full, shape = calls
    assert full["repo_id"] == "org/name" and full["revision"] == "v1" and full["cache_dir"] == "/cache"
    assert "*.safetensors" in full["allow_patterns"] and "*.safetensors" not in shape["allow_patterns"]
    assert "*.bin" not in full["allow_patterns"] and "original/*" in full["ignore_patterns"]
    (tmp_path / "config.json").unlink()
    with pytest.raises(HubFetchError, match="has no config.json"):
        fetch("org/name")


def test_engine_config_fetches_model_and_tokenizer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    asked: list[tuple[str, list[str]]] = []

    def fake(**kwargs: Any) -> str:
        asked.append((kwargs["repo_id"], kwargs["allow_patterns"]))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    cfg = EngineConfig(model="org/m", load_format="dummy", tokenizer_path="org/t").with_local_model()
    assert cfg.model == cfg.tokenizer_path == str(tmp_path)
    assert [repo for repo, _ in asked] == ["org/m", "org/t"]
    assert all(
        "*.safetensors" not in patterns for _, patterns in asked
    )  # dummy weights, tokenizer: no weights
    local = EngineConfig(model=str(tmp_path))
    assert local.with_local_model() is local and len(asked) == 2  # a local folder is never fetched


def test_generate_runs_a_hub_model_from_the_cache(tmp_path: Path) -> None:
    _hub_cache(tmp_path, "org/tiny", {"config.json": json.dumps(TINY_LLAMA)})
    flags = ["--load-format", "dummy", "--max-total-tokens", "2048", "--max-new-tokens", "3", "--ignore-eos"]
    proc = _cli("generate", "--model", "org/tiny", *flags, "hi", cache=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "[summary] tokens: 3" in proc.stdout + proc.stderr
    missing = _cli("generate", "--model", "org/absent", *flags, "hi", cache=tmp_path)
    assert missing.returncode == 2
    error = [line for line in missing.stderr.splitlines() if "error:" in line]
    assert len(error) == 1 and "--model org/absent: not fetched from the Hugging Face Hub" in error[0]


def test_served_name_of_a_hub_model_is_its_id() -> None:
    pytest.importorskip("fastapi")
    from nibblekv.server.launch import served_model_name

    assert served_model_name("Qwen/Qwen3-8B", None) == "Qwen/Qwen3-8B"
    assert served_model_name("/models/Qwen3-8B", None) == "Qwen3-8B"
    assert served_model_name("Qwen/Qwen3-8B", "qwen") == "qwen"


def test_a_tokenizer_repo_needs_no_model_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda **kwargs: str(tmp_path))
    cfg = EngineConfig(tokenizer_path="org/tok").with_local_model()
    assert cfg.tokenizer_path == str(tmp_path)
    with pytest.raises(HubFetchError, match="--model org/tok: the Hub repo has no config.json"):
        fetch("org/tok")


def test_eval_fetches_a_hub_model_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import argparse

    from nibblekv.eval.common import checked_data_dir

    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda **kwargs: str(tmp_path))
    args = argparse.Namespace(
        model="org/tiny", load_format="dummy", data_dir=None, _parser=argparse.ArgumentParser()
    )
    assert checked_data_dir(args).is_dir() and args.model == str(tmp_path)
