"""decode_mma's sm_90 compile (CPU only: a fake driver and the triton wheel's ptxas, see
benchmarks/tools/sass_decode.py): its launch grid is one wave of 12 one-warp programs per SM (``ppsm=16``:
16), which holds only while every build fits 168 (128) registers without spills.
Uncapped builds drift to 130 and 166 registers and run 10-25% slower on the H200. Head_dim 256 (two
128-dim halves a step, 64 accumulators) runs 8 programs per SM (248 registers). The token-balanced
kernel (``bal=1``) spills ~5 values into its tile loop at its defaults unless each page address is one
``IMAD.WIDE.U32``.
NOTE: at 12 programs per SM (168 registers, the default but at head_dim 256) and at 8 (248) nothing spills;
a ``ppsm=16`` build (128 registers) moves one 64-bit value through local memory at the loop's end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import triton

ROOT = Path(__file__).resolve().parents[1]
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(not PTXAS.exists(), reason="the triton wheel ships no ptxas here")
@pytest.mark.parametrize(
    "group,tail,head_dim,spec",
    [(4, False, 128, "mma"), (8, True, 128, "mma"), (3, True, 64, "mma"), (8, False, 128, "mma:vst=0,vq=0"),
     (4, True, 128, "mma"), (8, True, 128, "mma:bal=1,pf=0"), (4, False, 128, "mma:bal=1,tpi=1"),
     (8, True, 128, "mma:tpp=1"),
     (8, True, 128, "mma:bal=1"), (8, True, 256, "mma"), (6, False, 256, "mma"), (8, False, 256, "mma:vst=0,vq=0"),
     (6, True, 256, "mma:bal=1"), (4, True, 128, "mma:bal=1,bh=1"), (8, True, 256, "mma:bal=1,bh=1")],
)
def test_decode_mma_fits_its_programs_per_sm(group: int, tail: bool, head_dim: int, spec: str) -> None:
    from nibblekv.formats.layout import KVDtype
    from nibblekv.kernels.decode.config import _mma_max_registers
    from nibblekv.kernels.testing import decode_config_from_spec

    cfg = decode_config_from_spec(spec, KVDtype.NVFP4, head_dim)
    ppsm = cfg.bal_ppsm if "bal=1" in spec else cfg.ppsm
    assert ppsm == (8 if head_dim == 256 else 12)
    out = _compile(spec, "nvfp4", group, head_dim, tail)
    m = re.search(r"(\d+) bytes spill stores.*Used (\d+) registers", out)
    assert m, out[-2000:]
    assert ("decode_mma_bal_kernel" if "bal=1" in spec else "decode_mma_kernel") in out, out[-2000:]
    # at 168 registers (head_dim 64 and 128, the balanced kernel) and 248 (head_dim 256) nothing spills
    assert int(m.group(1)) == 0 and int(m.group(2)) <= _mma_max_registers(ppsm), m.group(0)


def test_mma_register_cap_counts_each_schedulers_file() -> None:
    # 16K registers per scheduler: ceil(ppsm / 4) warps must share one (14 at 144 registers ran as 12)
    from nibblekv.kernels.decode.config import _mma_max_registers

    assert [_mma_max_registers(p) for p in (16, 14, 13, 12, 8, 5, 4)] == [128, 128, 128, 168, 248, 248, 248]


@pytest.mark.skipif(not PTXAS.exists(), reason="the triton wheel ships no ptxas here")
@pytest.mark.parametrize("head_dim,most", [(128, 750), (64, 790), (256, 730)])
def test_decode_mma_main_loop_builds_each_page_address_in_one_instruction(head_dim: int, most: int) -> None:
    # A two-tile step's SASS: 776 (head_dim 128: 2 pages) and 843 (64: 4 pages, two a tile) while each page
    # address was a 64-bit multiply-add plus 64-bit adds per pointer; 742 / 779 with _page_addr. Head_dim
    # 256: a one-tile step of two halves, 713
    out = _compile("mma", "nvfp4", 4, head_dim, False)
    m = re.search(r"main loop (\d+) SASS/iter", out)
    assert m and "decode_mma_kernel" in out, out[-2000:]
    assert int(m.group(1)) <= most, m.group(0)


@pytest.mark.skipif(not PTXAS.exists(), reason="the triton wheel ships no ptxas here")
def test_decode_mma16_fits_its_programs_per_sm() -> None:
    # decode_mma16 (a GQA group of 16): no spills under the cap that lets WIDE_PPSM one-warp programs share an
    # SM (213 registers at tpi=2; 225 with its default L2 prefetch)
    from nibblekv.kernels.decode.config import _mma_max_registers
    from nibblekv.kernels.decode.knobs import WIDE_PPSM

    out = _compile("mma", "nvfp4", 16, 128, False)
    m = re.search(r"(\d+) bytes spill stores.*Used (\d+) registers", out)
    assert m and "decode_mma_kernel" in out, out[-2000:]
    assert int(m.group(1)) == 0 and 128 < int(m.group(2)) <= _mma_max_registers(WIDE_PPSM), m.group(0)


@pytest.mark.skipif(not PTXAS.exists(), reason="the triton wheel ships no ptxas here")
@pytest.mark.parametrize("dtype", ["fp8_e4m3", "nvfp4", "bf16"])
def test_decode_tok_keeps_three_programs_per_sm(dtype: str) -> None:
    # 4-warp programs: <= 168 registers keep 3 of them per SM (65536 / (168 * 128)). NOTE: NVFP4 (a fallback where decode_mma cannot run) takes 194
    # (2 per SM, <= 255): decoding sm-order words in plain Triton costs registers (190 with shifts and
    # masks, 194 with the converter's multiplies, whose loop is 1581 -> 1538 SASS): a known cost
    most = 200 if dtype == "nvfp4" else 168
    out = _compile("tok", dtype, 8, 128, True)
    m = re.search(r"(\d+) bytes spill stores.*Used (\d+) registers", out)
    assert m and "decode_tok_kernel" in out, out[-2000:]
    assert int(m.group(1)) == 0 and int(m.group(2)) <= most, m.group(0)


@pytest.mark.skipif(not PTXAS.exists(), reason="the triton wheel ships no ptxas here")
def test_decode_mma_head_dim_128_loads_the_next_step_mid_loop() -> None:
    # Why 12 programs an SM at head_dim 128 (knobs.mma_knobs): at 128 registers (16 an SM) ptxas issues the
    # register prefetch of the next step in the loop's last ~10%, at 168 around its middle
    spans = {}
    for spec in ("mma", "mma:ppsm=16"):
        out = _compile(spec, "nvfp4", 4, 128, True)
        m = re.search(r"loads at ([0-9.]+) / ([0-9.]+)", out)
        assert m, out[-2000:]
        spans[spec] = float(m.group(2))
    assert spans["mma"] < 0.75 and spans["mma:ppsm=16"] > 0.8, spans


@pytest.mark.skipif(not PTXAS.exists(), reason="the triton wheel ships no ptxas here")
@pytest.mark.parametrize(
    "head_dim,spec,smem",
    [(128, "mma:sms=3", 13848), (128, "mma:bal=1,sms=3", 13848), (128, "mma:sms=2,ppsm=16", 9232),
     (256, "mma:sms=4", 18464)],
)
def test_decode_mma_smem_ring_is_one_array(head_dim: int, spec: str, smem: int, tmp_path: Path) -> None:
    # smem_stages (ptx.ring): the ring is one static shared array of stages x 4,608 bytes + 8 a stage's
    # mbarrier (a second inlined copy of its asm would double it), filled by bulk copies (UBLKCP) that each
    # stage's mbarrier waits for, read by LDS; no spills under the register cap of its programs per SM
    from nibblekv.formats.layout import KVDtype
    from nibblekv.kernels.decode.config import _mma_max_registers
    from nibblekv.kernels.testing import decode_config_from_spec

    cfg = decode_config_from_spec(spec, KVDtype.NVFP4, head_dim)
    out = _compile(spec, "nvfp4", 8, head_dim, True, "--dump", str(tmp_path))
    m = re.search(r"(\d+) bytes spill stores.*Used (\d+) registers, used 0 barriers, (\d+) bytes smem", out)
    assert m, out[-2000:]
    per_sm = cfg.bal_ppsm if "bal=1" in spec else cfg.ppsm
    assert int(m.group(1)) == 0 and int(m.group(2)) <= _mma_max_registers(per_sm), m.group(0)
    assert int(m.group(3)) == smem, m.group(0)
    sass = "".join(f.read_text() for f in tmp_path.glob("*.sass"))
    for op in ("UBLKCP.S.G", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "LDS.128"):
        assert op in sass, (op, out[-1500:])


def _compile(spec: str, dtype: str, group: int, head_dim: int, tail: bool, *extra: str) -> str:
    """tools/sass_decode.py's report for one sm_90 build (no GPU: a fake driver and the wheel's ptxas)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "tools" / "sass_decode.py"), "--variants", spec,
           "--dtypes", dtype, "--group", str(group), "--head-dim", str(head_dim)]  # fmt: skip
    cmd += (["--tail"] if tail else []) + list(extra)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600).stdout
