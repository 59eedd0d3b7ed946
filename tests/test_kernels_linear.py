"""Gated DeltaNet decode kernels (``kernels.linear``: conv and gated delta rule, in place on a state pool)
against their pure-torch twins, under the interpreter on CPU (see conftest): small odd shapes, strided
q/k/v views of one projection as the model passes them, rows past the slots untouched."""

from __future__ import annotations

import pytest
import torch

from nibblekv.kernels.linear.decode import conv_decode_triton, gated_delta_rule_decode_triton
from nibblekv.kernels.linear.reference import conv_decode_ref, gated_delta_rule_decode_ref
from nibblekv.kernels.testing import rel_rms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rule_inputs(n: int, h: int, hv: int, dk: int, dv: int, dtype: torch.dtype, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, std: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(DEVICE)

    # q | k | v side by side in one [N, C] projection, as GatedDeltaNet splits its conv output
    mixed = rnd(n, 2 * h * dk + hv * dv).to(dtype)
    q, k, v = mixed.split([h * dk, h * dk, hv * dv], dim=-1)
    a = rnd(n, hv, std=4.0)
    a[0, 0] = 30.0  # softplus past its linear threshold
    return {
        "q": q.reshape(n, h, dk), "k": k.reshape(n, h, dk), "v": v.reshape(n, hv, dv),
        "a": a.to(dtype), "b": rnd(n, hv).to(dtype),
        "A_log": rnd(hv).abs().log1p(), "dt_bias": rnd(hv, std=0.5).to(dtype),
    }  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("n", "h", "hv", "dk", "dv"), [(3, 2, 6, 24, 40), (1, 1, 1, 16, 32), (4, 3, 3, 32, 8)]
)
def test_gated_delta_rule_decode_matches_twin(
    n: int, h: int, hv: int, dk: int, dv: int, dtype: torch.dtype
) -> None:
    x = _rule_inputs(n, h, hv, dk, dv, dtype)
    slots = torch.tensor([5, 0, 3, 2][:n], device=DEVICE)
    state = torch.randn(7, hv, dk, dv, device=DEVICE) * 0.3
    before, want_state = state.clone(), state.clone()
    want = gated_delta_rule_decode_ref(**x, state=want_state, slots=slots)
    got = gated_delta_rule_decode_triton(**x, state=state, slots=slots)
    assert got.dtype == dtype and got.shape == (n, hv, dv) and not got.isnan().any()
    assert rel_rms(got, want) < (1e-5 if dtype == torch.float32 else 1e-2)
    assert rel_rms(state, want_state) < 1e-5
    others = [i for i in range(7) if i not in slots.tolist()]
    assert torch.equal(state[others], want_state[others])  # rows of other requests untouched
    assert (state[slots] != before[slots]).float().mean() > 0.9  # the requests' rows did move


def test_gated_delta_rule_decode_steps_accumulate() -> None:
    """Three steps in place equal the twin's three steps (the state carried in the pool)."""
    state = torch.randn(3, 4, 16, 16, device=DEVICE) * 0.1
    want_state = state.clone()
    slots = torch.tensor([2, 0], device=DEVICE)
    for step in range(3):
        x = _rule_inputs(2, 2, 4, 16, 16, torch.float32, seed=step)
        want = gated_delta_rule_decode_ref(**x, state=want_state, slots=slots)
        got = gated_delta_rule_decode_triton(**x, state=state, slots=slots)
        assert rel_rms(got, want) < 1e-5
    assert rel_rms(state, want_state) < 1e-5


@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float16])
def test_half_precision_state_steps_in_float32(state_dtype: torch.dtype) -> None:
    """A bf16 / fp16 pool (``--mamba-ssm-dtype``): read, stepped in float32, rounded once when stored."""
    x = _rule_inputs(3, 2, 4, 16, 24, torch.bfloat16, seed=4)
    state = (torch.randn(4, 4, 16, 24, device=DEVICE) * 0.3).to(state_dtype)
    want_state = state.clone()
    slots = torch.tensor([3, 1, 0], device=DEVICE)
    want = gated_delta_rule_decode_ref(**x, state=want_state, slots=slots)
    got = gated_delta_rule_decode_triton(**x, state=state, slots=slots)
    assert state.dtype == state_dtype and rel_rms(got, want) < 1e-2 and rel_rms(state, want_state) < 1e-2
    assert torch.equal(state[2], want_state[2])


def test_padding_rows_on_one_scratch_slot_leave_real_rows_right() -> None:
    """CUDA-graph padding: rows 2 and 3 share the scratch slot (their results are garbage, nobody's state)."""
    x = _rule_inputs(4, 2, 4, 16, 16, torch.float32)
    state = torch.randn(4, 4, 16, 16, device=DEVICE)
    want_state = state.clone()
    slots = torch.tensor([1, 0, 3, 3], device=DEVICE)
    want = gated_delta_rule_decode_ref(**x, state=want_state, slots=slots)
    got = gated_delta_rule_decode_triton(**x, state=state, slots=slots)
    assert rel_rms(got[:2], want[:2]) < 1e-5
    assert rel_rms(state[:2], want_state[:2]) < 1e-5
    assert torch.equal(state[2], want_state[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "c", "width"), [(3, 37, 4), (1, 300, 4), (2, 9, 3)])
def test_conv_decode_matches_twin(n: int, c: int, width: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    proj = torch.randn(n, c + 5, generator=gen).to(DEVICE, dtype)
    x = proj[:, 2 : 2 + c]  # a strided view, as the projection's slice
    weight = torch.randn(c, 1, width, generator=gen).to(DEVICE, dtype)[:, 0, :]
    conv = torch.randn(5, c, width - 1, generator=gen).to(DEVICE, dtype)
    want_conv = conv.clone()
    slots = torch.tensor([4, 1, 2][:n], device=DEVICE)
    want = conv_decode_ref(x, weight, want_conv, slots)
    got = conv_decode_triton(x, weight, conv, slots)
    assert got.dtype == dtype and not got.isnan().any()
    assert rel_rms(got, want) < (1e-6 if dtype == torch.float32 else 1e-2)
    assert torch.equal(conv, want_conv)  # the shifted inputs are copies: exact
    assert torch.equal(conv[slots, :, -1], x.to(conv.dtype))


def test_launchers_name_bad_shapes() -> None:
    x = _rule_inputs(2, 2, 4, 16, 16, torch.float32)
    slots = torch.tensor([0, 1], device=DEVICE)
    with pytest.raises(ValueError, match="float32, bfloat16"):
        int_state = torch.zeros(2, 4, 16, 16, dtype=torch.int32)
        gated_delta_rule_decode_triton(**x, state=int_state, slots=slots)
    with pytest.raises(ValueError, match="HV a multiple of H"):
        gated_delta_rule_decode_triton(**{**x, "v": torch.zeros(2, 3, 16)}, state=torch.zeros(2, 3, 16, 16),
                                       slots=slots)  # fmt: skip
    with pytest.raises(ValueError, match="want"):
        conv_decode_triton(torch.zeros(2, 8), torch.zeros(8, 4), torch.zeros(3, 8, 2), slots)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stacked_conv_extend_equals_one_sequence_at_a_time(dtype: torch.dtype) -> None:
    """The model's prefill conv (every sequence stacked behind its state, one conv) against the per-sequence
    twin: sequences shorter than the window, of one token, and long ones; outputs and new states."""
    from nibblekv.kernels.linear.reference import conv_extend_ref
    from nibblekv.model.gated_deltanet import causal_conv_extend

    gen = torch.Generator().manual_seed(5)
    cu = [0, 2, 3, 20, 21, 29]
    x = torch.randn(cu[-1], 11, generator=gen).to(DEVICE, dtype)
    weight = torch.randn(11, 4, generator=gen).to(DEVICE, dtype)
    state = torch.randn(5, 11, 3, generator=gen).to(DEVICE, dtype)
    y, new = causal_conv_extend(x, weight, cu, state)
    y_ref, new_ref = conv_extend_ref(x, weight, cu, state)
    assert y.dtype == dtype and new.shape == state.shape and new.is_contiguous()
    # the same products and sums (on a GPU another conv algorithm, TF32 in float32, may round differently)
    assert rel_rms(y, y_ref) < (1e-3 if dtype == torch.float32 else 1e-2)
    assert torch.equal(new, new_ref)  # copies of the inputs
    assert torch.equal(new[0, :, :1], state[0, :, 2:]) and torch.equal(new[0, :, 1:], x[0:2].T)  # 2 < W - 1
