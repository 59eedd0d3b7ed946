"""Compile the extend kernel for sm_90 on a machine without a GPU and count what its key loops execute.

Usage (CPU; no CUDA needed)::

    PYTHONPATH=. python benchmarks/sass_extend.py [--dtypes bf16,fp8_e4m3,nvfp4]
        [--configs 1:0 1:2 ...] [--dump DIR] [--out benchmarks/results/extend-sass.md]

Reuses ``sass_decode``'s fake sm_90 driver and compile-only launches, and ``bench_extend.extend_rows``'s
tensors at its first shape (B=32 x 8192-token prefix, 16-token chunks, Hq=32 Hkv=8 D=128, page 16).
Configs are ``SPLITS:STAGES[:WARPS[:BM[:BN]]]`` as in bench_extend (0 = the launcher's default).
Per kernel: registers and spills (``ptxas -v``), shared memory, the SASS loops (backward branches), and
for each loop its length and instruction mix. The pipelining of each loop comes from the TTGIR: buffer
depth, commit groups per iteration and the ``async_wait`` count (groups left in flight). Metric: **warp-
instructions per key-token-head** = loop length x num_warps / BN, and per key-token-head *and query
token* (/ (BM / G): one extend pass serves BM / G query tokens, decode one). Decode ``tok`` (FP8/BF16)
and ``mma`` (NVFP4) compile at sass_decode's shape for comparison. Writes the tables between the
GENERATED markers of ``--out`` (the hand-written text around them stays).
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch
from triton.runtime import driver as _driver
from triton.runtime.jit import JITFunction

from benchmarks import bench_extend
from benchmarks.sass_decode import _compile_only, _FakeDriver, loops, ptxas_usage, sass_of

GQA = 32 // 8  # extend_rows' default hq / hkv: rows per query token
DEFAULT_CONFIGS = ["1:0", "1:2", "1:3", "1:7", "4:0", "1:0:8", "1:0:0:32:64", "1:0:0:64:32", "1:0:0:128:64"]
BEGIN, END = "<!-- BEGIN GENERATED (sass_extend.py) -->", "<!-- END GENERATED -->"
SMEM_PER_SM, REGS_PER_SM = 233472, 65536  # sm_90: 228 KB shared memory (1 KB reserved per block), 64K regs
KERNELS: dict[str, Any] = {}  # fn name -> compiled kernel of its last (compile-only) launch
# (column, opcode regex) of the loop mix; an instruction counts in the first class it matches
CLASSES = [
    ("nop", r"^@!PT "), ("LDG", r"^LDG\."), ("LDGSTS", r"^LDGSTS"), ("TMA", r"^UTMA|^UBLKCP"),
    ("depbar", r"^(LDGDEPBAR|DEPBAR)"), ("LDSM", r"^LDSM"), ("LDS", r"^LDS"), ("STS", r"^STS"),
    ("HMMA", r"^HMMA"), ("HGMMA", r"^HGMMA"), ("BAR", r"^BAR"), ("fence", r"^(MEMBAR|FENCE)"), ("wg", r"^WARPGROUP"),
    ("cvt", r"^(F2F|F2FP|I2F|F2I)"), ("PRMT", r"^PRMT"), ("LOP3/SHF", r"^(LOP3|SHF\.|SHL|SHR)"),
    ("H2", r"^H(MUL2|FMA2|ADD2)"), ("SHFL", r"^SHFL"), ("EX2", r"^MUFU"),
    ("fp32", r"^F(MUL|FMA|ADD|MNMX|SEL|SETP)"), ("int", r"^(IMAD|IADD3|LEA|VIADD|ISETP|SEL|MOV|UIADD3|ULEA|UMOV)"),
]  # fmt: skip


def _record(self: JITFunction, *args: Any, **kwargs: Any) -> Any:
    k = _compile_only(self, *args, **kwargs)
    KERNELS[self.fn.__name__] = k
    return k


def mix(ins: list[tuple[int, str]], lo: int, hi: int) -> dict[str, Any]:
    """Instruction classes of SASS range [lo, hi]; LDG/LDGSTS also by width."""
    c: collections.Counter[str] = collections.Counter()
    widths: collections.Counter[str] = collections.Counter()
    for a, txt in ins:
        if not lo <= a <= hi:
            continue
        op = re.sub(r"^@!?U?P\w+\s+", "", txt) if not txt.startswith("@!PT") else txt
        cls = next((n for n, rx in CLASSES if re.search(rx, op)), "other")
        c[cls] += 1
        if cls in ("LDG", "LDGSTS"):
            widths[op.split()[0].replace(".E", "").replace(".BYPASS", "")] += 1
    return {**c, "widths": dict(widths)}


def ttgir_loops(ttgir: str) -> list[dict[str, Any]]:
    """Per ``scf.for`` (in order): buffer depth/KB of the mutable allocs it indexes, async copies, commit
    groups, async_wait counts, synchronous tt.load's, dots and their wait pendings."""
    lines = ttgir.splitlines()
    allocs: dict[str, tuple[list[int], int]] = {}
    for ln in lines:
        m = re.search(r"(%\w+) = ttg\.local_alloc : \(\) -> !ttg\.memdesc<([\dx]+)x(\w+), .*mutable", ln)
        if m:
            bits = int(re.match(r"[a-z]+(\d+)", m.group(3)).group(1))  # type: ignore[union-attr]
            allocs[m.group(1)] = ([int(x) for x in m.group(2).split("x")], bits)
    views = dict(re.findall(r"(%\w+) = ttg\.memdesc_index (%\w+)\[", ttgir))  # buffer view -> its alloc
    res = []
    for i, ln in enumerate(lines):
        if " scf.for " not in ln:
            continue
        ind = len(ln) - len(ln.lstrip())
        j = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(" " * ind + "}"))
        body = "\n".join(lines[i + 1 : j])
        dsts = re.findall(r"async_copy_global_to_local %\w+, (%\w+)", body)
        used = sorted({views.get(d, d) for d in dsts} & set(allocs))
        depth = sorted({allocs[u][0][0] for u in used})
        kb = sum(math.prod(allocs[u][0]) * allocs[u][1] / 8 for u in used) / 1024
        res.append({
            "depth": depth, "buf_kb": kb, "copies": body.count("async_copy_global_to_local"),
            "groups": body.count("async_commit_group"), "waits": re.findall(r"async_wait .*num = (\d+)", body),
            "sync_loads": len(re.findall(r"= tt\.load ", body)), "page_async": bool(re.search(
                r"async_copy_global_to_local .*tensor<\d+x!tt\.ptr<i32>", body)),
            "wgmma": body.count("ttng.warp_group_dot "), "mma_v2": body.count("= tt.dot "),
            "dot_pend": re.findall(r"warp_group_dot_wait .*pendings = (\d+)", body),
        })  # fmt: skip
    return res


def analyse(k: Any, warps: int, bn: int, rows_per_key: int) -> dict[str, Any]:
    ins = sass_of(k.asm["cubin"])
    usage = ptxas_usage(k.asm["ptx"])
    regs = int(re.search(r"Used (\d+) registers", usage).group(1))  # type: ignore[union-attr]
    spill = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", usage))
    smem = int(k.metadata.shared)
    per_warp = math.ceil(regs / 8) * 8 * 32
    occ = min(SMEM_PER_SM // (smem + 1024), REGS_PER_SM // (per_warp * warps), 64 // warps)
    lps = sorted(loops(ins))  # address order = program order: main-pool prefix, (tail), own chunk
    return {"regs": regs, "spill": spill, "smem_kb": smem / 1024, "occ": occ, "ins": ins,
            "loops": [(a, b, n, mix(ins, a, b)) for a, b, n in lps], "ttgir": ttgir_loops(k.asm["ttgir"]),
            "per_kth": [n * warps / bn for _, _, n in lps], "rows": rows_per_key}  # fmt: skip


def compile_extend(dtypes: list[str], configs: list[str]) -> list[tuple[str, str, dict[str, Any]]]:
    out: list[tuple[str, str, dict[str, Any]]] = []
    bench_extend.SHAPES = bench_extend.SHAPES[:1]  # B=32 x 8192 prefix, 16-token chunks
    parsed = [tuple(int(x) for x in c.split(":")) for c in configs]
    names = {v: k for k, v in bench_extend.NAMES.items()}

    def bench(fn: Any) -> float:
        kw, pool = fn.keywords, fn.args[4]
        if bench_extend.NAMES[pool.dtype] not in dtypes:
            return 0.0
        KERNELS.pop("_extend_kernel", None)
        fn()
        k = KERNELS["_extend_kernel"]
        warps, bm, bn = k.metadata.num_warps, int(kw["block_m"] or 64), int(kw["block_n"] or 64)
        cfg = f"S{kw['num_splits']} st{k.metadata.num_stages} w{warps} {bm}x{bn}"
        out.append((bench_extend.NAMES[pool.dtype], cfg, {**analyse(k, warps, bn, bm // GQA), "k": k}))
        return 0.0

    assert all(d in names for d in dtypes), dtypes
    bench_extend.extend_rows(bench, "cpu", configs=parsed)
    return out


def compile_decode(dtypes: list[str]) -> list[tuple[str, str, dict[str, Any]]]:
    from nibblekv.formats.layout import KVDtype
    from nibblekv.kernels import decode as dec
    from nibblekv.kernels.testing import make_batch

    out = []
    for dname in dtypes:
        spec = "mma" if dname == "nvfp4" else "tok"
        pb = make_batch(KVDtype(dname), [300, 77], 8, 128, 16, "cpu", via_write=False)
        q = torch.randn(2, 32, 128).to(torch.bfloat16)
        dec.decode_triton(q, pb.cache, pb.page_table, pb.lens, 0.1, num_splits=2, variant=spec)
        _, cfg = dec.resolve_variant(spec, {"nvfp4": 2, "fp8_e4m3": 1}.get(dname, 0), 128, False)
        k = dec.LAST_KERNEL["decode"]
        w = int(cfg["num_warps"])
        keys = w * 16 * int(cfg["tpi"]) if spec == "mma" else int(cfg["block_n"])
        a = analyse(k, w, keys, 1)
        big = max(range(len(a["loops"])), key=lambda i: a["loops"][i][2])  # the main key loop
        a["loops"], a["per_kth"], a["ttgir"] = [a["loops"][big]], [a["per_kth"][big]], []
        out.append((dname, f"decode {spec} w{w} keys/iter {keys}", a))
    return out


def _pipe(tg: dict[str, Any]) -> str:
    ahead = max((int(w) for w in tg["waits"]), default=0) / max(tg["groups"], 1)
    return f"{tg['depth'][0] if tg['depth'] else 0} ({tg['buf_kb']:.0f}) | {ahead:g}"


def tables(ext: list[tuple[str, str, dict[str, Any]]], dec: list[tuple[str, str, dict[str, Any]]]) -> str:
    cols = [n for n, _ in CLASSES] + ["other"]
    head = ("| dtype | config | regs | spill B | smem KiB | progs/SM | SASS loops (instr/iter) | prefix bufs (KiB) | "
            "prefix blocks in flight at its wait | sync tt.load in prefix loop | page table | own-chunk bufs (KiB) | "
            "own blocks in flight | warp-instr / key-token-head | / query token |")  # fmt: skip
    t = [head, "|---" * 15 + "|"]
    m = [
        "| dtype | config | loop | " + " | ".join(cols) + " | LDG/LDGSTS widths |",
        "|---" * (len(cols) + 4) + "|",
    ]
    for dname, cfg, a in ext + dec:
        tg = a["ttgir"]
        pre = (
            f"{_pipe(tg[0])} | {tg[0]['sync_loads']} | {'cp.async' if tg[0]['page_async'] else 'tt.load'}"
            if tg
            else "- | - | - | -"
        )
        own = _pipe(tg[-1]) if len(tg) > 1 else "- | -"
        per = a["per_kth"][0] if a["per_kth"] else 0.0
        t.append(f"| {dname} | {cfg} | {a['regs']} | {a['spill']} | {a['smem_kb']:.0f} | {a['occ']} | "
                 f"{[n for _, _, n, _ in a['loops']]} | {pre} | {own} | {per:.1f} | {per / a['rows']:.1f} |")  # fmt: skip
        for li, (_, _, n, mx) in enumerate(a["loops"][:2]):
            name = "key" if cfg.startswith("decode") else ("prefix", "own")[li]
            m.append(f"| {dname} | {cfg} | {name} ({n}) | " + " | ".join(str(mx.get(c, 0)) for c in cols)
                     + f" | {' '.join(f'{k}:{v}' for k, v in sorted(mx['widths'].items()))} |")  # fmt: skip
    return "\n".join(t) + "\n\nInstruction mix per loop iteration (per warp, SASS):\n\n" + "\n".join(m) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="bf16,fp8_e4m3,nvfp4")
    ap.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, help="SPLITS:STAGES[:WARPS[:BM[:BN]]]")
    ap.add_argument("--dump", default="", help="directory for each kernel's ttgir/ptx/sass")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "extend-sass.md")
    args = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    _driver.set_active(_FakeDriver())  # type: ignore[arg-type]
    JITFunction.run = _record  # type: ignore[method-assign]
    dtypes = args.dtypes.split(",")
    ext = compile_extend(dtypes, args.configs)
    dec = compile_decode(dtypes)
    for dname, cfg, a in ext + dec:
        print(f"{dname:9s} {cfg:34s} regs {a['regs']} spill {a['spill']} smem {a['smem_kb']:.0f} KB "
              f"progs/SM {a['occ']} loops {[n for _, _, n, _ in a['loops']]} "
              f"per key-token-head {[round(x, 1) for x in a['per_kth']]} ttgir {a['ttgir'][:2]}", flush=True)  # fmt: skip
        if args.dump and "k" in a:
            os.makedirs(args.dump, exist_ok=True)
            base = os.path.join(args.dump, f"{dname}_{re.sub(r'[^A-Za-z0-9]+', '_', cfg)}")
            for ext_name in ("ttgir", "ptx"):
                Path(f"{base}.{ext_name}").write_text(a["k"].asm[ext_name])
            Path(f"{base}.sass").write_text("\n".join(f"{x:05x} {t}" for x, t in a["ins"]))
    gen = f"{BEGIN}\n{tables(ext, dec)}{END}"
    old = (
        args.out.read_text()
        if args.out.exists()
        else f"# Extend kernel: sm_90 SASS per key block\n\n{BEGIN}\n{END}\n"
    )
    i, j = old.find(BEGIN), old.find(END)
    args.out.write_text(old[:i] + gen + old[j + len(END) :] if i >= 0 and j >= 0 else old + "\n" + gen + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
