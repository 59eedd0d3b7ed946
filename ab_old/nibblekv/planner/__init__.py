"""Capacity planner: KV tokens and full-context sessions per GPU (``nibblekv plan``)."""

from nibblekv.planner.plan import (
    GPUS,
    Gpu,
    KVPlan,
    MemoryRule,
    ModelShape,
    ParamCount,
    Plan,
    PlanError,
    Weights,
    estimate_params,
    estimate_weights_gib,
    kv_bytes_per_token,
    make_plan,
    parse_gpu,
    plan_for,
    shape_from_config,
)

__all__ = [
    "GPUS",
    "Gpu",
    "KVPlan",
    "MemoryRule",
    "ModelShape",
    "ParamCount",
    "Plan",
    "PlanError",
    "Weights",
    "estimate_params",
    "estimate_weights_gib",
    "kv_bytes_per_token",
    "make_plan",
    "parse_gpu",
    "plan_for",
    "shape_from_config",
]
