"""Mapping: operators to kernels (fusion plan), tiles, formats and layouts."""

from opmap.mapping.fusion import POLICIES, FusionPlan, Kernel, plan_fusion

__all__ = ["POLICIES", "FusionPlan", "Kernel", "plan_fusion"]
