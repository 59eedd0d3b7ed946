"""The CLI as a new user meets it: help texts, one-line errors for bad input, a clean Ctrl-C, packaged text.

Bad input runs ``python3 -m nibblekv`` as a subprocess and must be refused before any model loads: exit 2,
one line on stderr naming the problem, no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from model_helpers import TINY_LLAMA

from nibblekv.cli import build_parser, main
from nibblekv.config import EngineConfig
from nibblekv.engine.batch_io import BatchFileError, done_ids
from nibblekv.eval.data import CALIBRATION_FILE, DEFAULT_DATA_DIR, calibration_text, eval_texts, token_windows
from nibblekv.eval.kv_eval import EvalSettings

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def tiny(tmp_path: Path) -> list[str]:
    """Engine flags for a tiny random-weight model (loads in well under a second)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return ["--load-format", "dummy", "--model", str(path), "--max-total-tokens", "2048"]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout, whatever is installed
    cmd = [sys.executable, "-m", "nibblekv", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _one_line_error(proc: subprocess.CompletedProcess[str], command: str) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"nibblekv {command}: error: "), proc.stderr
    return lines[0]


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                out += _parsers(child)
    return out


def test_help_speaks_to_users() -> None:
    parsers = {p.prog: p for p in _parsers(build_parser())}
    assert {"nibblekv generate", "nibblekv serve", "nibblekv bench serve", "nibblekv eval kv"} <= set(parsers)
    for prog, p in parsers.items():
        text = p.format_help()
        assert "`" not in text, f"{prog} --help shows markup"
        assert p.description, f"{prog} has no description"
    top = parsers["nibblekv"]
    assert "4 bits (NVFP4)" in (top.description or "") and "examples:" in top.format_help()
    generate = parsers["nibblekv generate"].format_help()
    for key in ('"prompt"', '"messages"', '"input_ids"', '"sampling_params"', '"finish_reason"', '"id"'):
        assert key in generate  # the JSONL schema, in --input-jsonl / --output-jsonl help
    bench = parsers["nibblekv bench serve"]
    for action in bench._actions:
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            assert "default" in (action.help or ""), f"{action.option_strings[0]} hides its default"
    num_prompts = r"--num-prompts NUM_PROMPTS\s+requests \(agentic: sessions\) \(default: 100\)"
    assert re.search(num_prompts, bench.format_help())


@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", "--model", "/nonexistent", "hi"], "--model /nonexistent: no such file or folder"),
        (["generate", "--model", "llama-3.1-8b", "hi"], "add --load-format dummy"),
        (["serve", "--model", "/nonexistent"], "--model /nonexistent: no such file or folder"),
        (["serve", "--model", "llama-3.1-8b"], "add --load-format dummy"),
        (["serve", "--chat-template", "nope.jinja"], "--chat-template: no file 'nope.jinja'"),
        (
            ["serve", "--model-path", "/nonexistent"],
            "--model /nonexistent: no such file or folder",
        ),  # SGLang's name
        (["generate", "--chat-template", "{{ x", "hi"], "--chat-template: the template does not parse"),
    ],
)
def test_bad_model_is_one_line_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    started = time.monotonic()
    line = _one_line_error(_cli(*args, cwd=tmp_path), args[0])
    assert message in line
    assert time.monotonic() - started < 60  # refused before any weights load (serve: before the port opens)


def test_malformed_batch_line_is_reported_and_nothing_is_redone(tmp_path: Path, tiny: list[str]) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = ['{"prompt": "a"}', '{"prompt": "b"}', '{"prompt": c}', '{"id": "last", "prompt": "d"}']
    inp.write_text("\n".join(lines) + "\n")
    first = [{"id": "0", "text": "A", "finish_reason": "length", "prompt_tokens": 1, "completion_tokens": 2}]
    out.write_text("".join(json.dumps(r) + "\n" for r in first))  # a row an earlier run wrote
    before = out.read_bytes()
    argv = ["generate", "--input-jsonl", str(inp), "--output-jsonl", str(out), "--max-new-tokens", "3"]
    line = _one_line_error(_cli(*argv, *tiny, cwd=tmp_path), "generate")
    assert f"{inp}:3: not JSON" in line
    assert out.read_bytes() == before
    lines[2] = '{"prompt": "c"}'
    inp.write_text("\n".join(lines) + "\n")
    assert main([*argv, "--ignore-eos", *tiny]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows[0] == first[0]  # kept, not redone
    assert sorted(r["id"] for r in rows) == ["0", "1", "2", "last"]
    assert all(r["completion_tokens"] == 3 for r in rows[1:])


def test_row_the_model_refuses_is_reported_before_any_runs(
    tmp_path: Path, tiny: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text('{"prompt": "fine"}\n{"input_ids": [1, 999]}\n')  # the tiny vocabulary has 320 tokens
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--input-jsonl", str(inp), "--output-jsonl", str(out), *tiny])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"nibblekv generate: error: {inp}:2: prompt token ids must be in [0, 320)" in err
    assert "Traceback" not in err
    assert not out.exists() or out.read_text() == ""  # no row ran


def test_output_with_a_foreign_line_is_refused_untouched(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "0", "text": "x"}\n{"prompt": "not a result"}\n{"id": "1", "text": "y"}\n')
    before = out.read_bytes()
    with pytest.raises(BatchFileError, match=r"out.jsonl:2: not a result row"):
        done_ids(out)
    assert out.read_bytes() == before
    out.write_text('{"id": "0", "text": "x"}\n{"id": "1", "te')  # killed mid-write: the torn line goes
    assert done_ids(out) == {"0"} and out.read_text() == '{"id": "0", "text": "x"}\n'


def test_ctrl_c_in_batch_mode_exits_130_with_one_line(tmp_path: Path, tiny: list[str]) -> None:
    rows = [{"prompt": f"p{i}"} for i in range(100)]
    rows[0]["sampling_params"] = {"max_new_tokens": 1}  # written at once; the others run on
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    argv = ["generate", "--input-jsonl", "in.jsonl", "--output-jsonl", "out.jsonl", "--max-new-tokens", "200"]
    argv += ["--ignore-eos", "--max-running-requests", "2", "--decode-log-interval", "0", *tiny]
    proc = subprocess.Popen(
        [sys.executable, "-m", "nibblekv", *argv],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # NOTE: a shell's background job inherits SIGINT ignored; Python then never raises KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 90
        while not (out.exists() and out.read_text()) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    written = len(out.read_text().splitlines())
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"nibblekv generate: interrupted: {written} of 100 rows are done in out\.jsonl; rerun the same "
        r"command \(same --output-jsonl\) to resume with the rest",
        last,
    ), last
    assert 1 <= written < 100


def test_eval_text_ships_with_the_package(smollm2) -> None:  # type: ignore[no-untyped-def]
    _, tok = smollm2
    assert DEFAULT_DATA_DIR.parent == REPO / "nibblekv" / "eval"
    assert sum(p.stat().st_size for p in DEFAULT_DATA_DIR.iterdir()) < 220_000
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "texts/*.txt" in data["nibblekv.eval"]  # the files travel in the wheel
    # the defaults of `nibblekv eval kv` and `nibblekv calibrate` fit in the shipped text
    d = EvalSettings()
    assert token_windows(tok, eval_texts(DEFAULT_DATA_DIR), d.windows, d.window_tokens).shape == (16, 512)
    calib = [(CALIBRATION_FILE, calibration_text(DEFAULT_DATA_DIR))]
    assert token_windows(tok, calib, 8, 1024).shape == (8, 1024)


def test_sglang_flag_names_are_accepted() -> None:
    args = build_parser().parse_args(["serve", "--model-path", "m.gguf", "--random-seed", "7", "--tp", "2"])
    assert (args.model, args.seed, args.tp_size) == ("m.gguf", 7, 2)


def test_sglang_compatibility_switches_are_accepted() -> None:
    args = build_parser().parse_args(
        ["serve", "--trust-remote-code", "--enable-metrics", "--model-path", "m"]
    )
    assert args.trust_remote_code and args.enable_metrics and args.model == "m"
    assert EngineConfig.from_args(args).model == "m"  # the switches change nothing in the engine config
