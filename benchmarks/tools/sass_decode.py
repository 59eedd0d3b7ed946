"""Question: what does a decode variant execute per token on sm_90 (registers, spills, SASS loop length)?
Compiles decode variants for sm_90 on a machine without a GPU and counts SASS instructions per token.

Usage (CPU; no CUDA needed)::

    PYTHONPATH=. python benchmarks/tools/sass_decode.py [--variants tok,tok:bn=128 ...]
        [--dtypes nvfp4,fp8_e4m3,bf16] [--dump DIR]

A fake Triton driver reports an sm_90 target and the launcher's kernel launches become compile-only
(``warmup=True``), so ``decode_triton`` runs unchanged on CPU tensors. A variant is a spec
``kernel[:key=value,...]`` (``nibblekv.kernels.testing.decode_config_from_spec``), turned into the typed
``DecodeConfig`` the launcher takes. For each compiled kernel it
prints the registers and spill bytes (``ptxas -v``), the loops of its SASS (backward branches) and, for
the largest loop (the main-pool key loop), SASS instructions per iteration, where its global loads sit in
it (first and median, as fractions of the loop) and **warp-instructions per token-head** = loop length x
num_warps / BN: our local proxy for speed (an H200 issues ~0.9e12 warp-instructions/s; NVFP4 at 0.8 of the
ceiling needs ~25e9 token-heads/s).
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver as _driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


class _FakeDriver:
    """Just enough of a driver for JITFunction.run(warmup=True): an sm_90 target, device 0, stream 0."""

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int = 0) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


_orig_run = JITFunction.run


def _root(e: BaseException) -> str:
    """The innermost cause of a compile error (Triton wraps the real message in one error per call level)."""
    while e.__cause__ is not None:
        e = e.__cause__
    return f"{type(e).__name__}: {e}"


def _compile_only(self, *args, grid, warmup, **kwargs):  # type: ignore[no-untyped-def]
    return _orig_run(self, *args, grid=grid, warmup=True, **kwargs)


def ptxas_usage(ptx: str) -> str:
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "k.ptx")
        open(p, "w").write(ptx)
        r = subprocess.run([os.path.join(BIN, "ptxas"), "-v", "--gpu-name", "sm_90a", p, "-o", os.path.join(d, "k.o")],
                           capture_output=True, text=True)  # fmt: skip
        lines = [ln.split("info    : ")[-1] for ln in r.stderr.splitlines() if "registers" in ln or "spill" in ln]
        return "; ".join(lines) or r.stderr[-300:]


def sass_of(cubin: bytes) -> list[tuple[int, str]]:
    """(address, instruction text) of every SASS instruction."""
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "k.cubin")
        open(p, "wb").write(cubin)
        out = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", p], capture_output=True, text=True).stdout
    ins = []
    for ln in out.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", ln)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    return ins


def loops(ins: list[tuple[int, str]]) -> list[tuple[int, int, int]]:
    """(start, end, instruction count) of each backward branch's range, largest first. NOTE: only predicated
    branches close loops; an unconditional backward BRA returns from out-of-line code (e.g. an mbarrier
    wait's spin block placed after EXIT) into the middle of the real loop."""
    res = []
    for addr, txt in ins:
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", txt)
        if m and "@!PT" not in txt and txt.startswith("@"):
            tgt = int(m.group(1), 16)
            if tgt < addr:
                res.append((tgt, addr, sum(1 for a, _ in ins if tgt <= a <= addr)))
    return sorted(res, key=lambda t: -t[2])


def load_span(ins: list[tuple[int, str]], lo: int, hi: int) -> tuple[float, float] | None:
    """Where the global loads of loop ``[lo, hi]`` sit, as fractions of its instructions (first, median): a
    register prefetch whose loads come last in the loop hides little of their latency. None without loads."""
    body = [t for a, t in ins if lo <= a <= hi]
    at = [i / len(body) for i, t in enumerate(body) if re.sub(r"^@!?U?P\w+\s+", "", t).startswith("LDG")]
    return (at[0], at[len(at) // 2]) if at else None


def opcode_histogram(ins: list[tuple[int, str]], lo: int, hi: int) -> list[tuple[str, int]]:
    c: collections.Counter[str] = collections.Counter()
    for a, txt in ins:
        if lo <= a <= hi:
            op = re.sub(r"^@!?U?P\w+\s+", "", txt).split()[0].split(".")[0]
            c[op] += 1
    return c.most_common(14)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="paged rows tok", help="specs separated by spaces (or by ; when a spec has spaces)")
    ap.add_argument("--dtypes", default="nvfp4,fp8_e4m3,bf16")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--tail", action="store_true", help="launch with a bf16 tail (compiles the tail loop too)")
    ap.add_argument("--active", action="store_true", help="mma: the CUDA-graph build (DYN: rows past *active pad)")
    ap.add_argument("--hist", action="store_true", help="print an opcode histogram of the main loop")
    ap.add_argument("--dump", default="", help="directory for each variant's ptx/sass")
    args = ap.parse_args()
    _driver.set_active(_FakeDriver())  # type: ignore[arg-type]
    JITFunction.run = _compile_only  # type: ignore[method-assign]
    from nibblekv.formats.layout import KVDtype
    from nibblekv.kernels.decode import launch as dec
    from nibblekv.kernels.testing import decode_config_from_spec, make_batch

    d, hkv = args.head_dim, 8
    rows = []
    for dname in args.dtypes.split(","):
        dt = KVDtype(dname)
        pb = make_batch(dt, [300, 77], hkv, d, 16, "cpu", tail_lens=[64, 3] if args.tail else None, via_write=False)
        q = torch.randn(2, hkv * args.group, d).to(torch.bfloat16)
        for spec in args.variants.split(";" if ";" in args.variants else " "):
            if not spec:
                continue
            try:
                cfg = decode_config_from_spec(spec, dt, d)
                act = torch.tensor([1], dtype=torch.int32) if args.active else None
                dec.decode_triton(q, pb.view(active=act), 0.1, num_splits=2, config=cfg)
            except Exception as e:  # noqa: BLE001 - report and go on
                cause = _root(e)[-1500:]
                print(f"{dname:9s} {spec:28s} COMPILE FAILED: {str(e)[-1500:]} | cause: {cause}", flush=True)
                continue
            k = dec.LAST_KERNEL["decode"]
            ins = sass_of(k.asm["cubin"])  # type: ignore[attr-defined]
            lp = loops(ins)
            usage = ptxas_usage(k.asm["ptx"])  # type: ignore[attr-defined]
            spill_ins = sum(1 for _, t in ins if t.split()[0].startswith(("LDL", "STL")) or " LDL" in t or " STL" in t)
            main_len = lp[0][2] if lp else 0
            # NOTE: an mma loop iteration attends tpi 16-row tiles per warp (head_dim 64: a row is 2 tokens)
            tiles = cfg.tpi * (2 if d == 64 else 1) if cfg.mma else 1
            per_th = main_len * cfg.num_warps / (cfg.block_n * tiles)
            rows.append((dname, spec, per_th))
            smem = getattr(k.metadata, "shared", "?")  # type: ignore[attr-defined]
            span = load_span(ins, lp[0][0], lp[0][1]) if lp else None
            at = f"{span[0]:.2f} / {span[1]:.2f}" if span else "-"
            print(f"{dname:9s} {spec:28s} {getattr(k, 'name', '?')} cfg={cfg} | {usage} | smem {smem} B | LDL/STL {spill_ins} | loops {[n for _, _, n in lp[:4]]}"
                  f" | main loop {main_len} SASS/iter -> {per_th:.1f} warp-instr per token-head"
                  f" | loads at {at} (first / median)", flush=True)  # fmt: skip
            if args.hist and lp:
                print("    ", opcode_histogram(ins, lp[0][0], lp[0][1]))
            if args.dump:
                os.makedirs(args.dump, exist_ok=True)
                base = os.path.join(args.dump, f"{dname}_{re.sub(r'[^A-Za-z0-9=]+', '_', spec)}")
                open(base + ".ptx", "w").write(k.asm["ptx"])  # type: ignore[attr-defined]
                open(base + ".ttgir", "w").write(k.asm["ttgir"])  # type: ignore[attr-defined]
                open(base + ".sass", "w").write("\n".join(f"{a:05x} {t}" for a, t in ins))
    print("\nwarp-instructions per token-head (main loop):")
    for dname, spec, per in rows:
        print(f"  {dname:9s} {spec:28s} {per:6.1f}")
    sys.stdout.flush()
    _ = math


if __name__ == "__main__":
    main()
