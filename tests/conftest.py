"""Test setup. NOTE: TRITON_INTERPRET must be set before anything imports triton."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
