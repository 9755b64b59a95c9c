"""Production-shape validation: a synthetic kernel stands for production kernels of its class, bound and regime."""

from __future__ import annotations

import pytest

pytest.importorskip("duckdb")

from opmap.errors import OpmapError  # noqa: E402
from opmap.record import record as record_json  # noqa: E402
from opmap.store import record  # noqa: E402
from opmap.store.compare import compare  # noqa: E402
from opmap.store.shapes import kernel_class, production_check  # noqa: E402
from opmap.tags import Tags  # noqa: E402


def _gemm(m, n, k, elt=2):
    """A GEMM's FLOPs (2 m n k) and minimum bytes (each operand once: (m k + k n + m n) x element size)."""
    return 2.0 * m * n * k, float(elt * (m * k + k * n + m * n))


def _run(kernels):
    """kernels: [(op, flops, bytes, bound, seconds)] -> an analysis payload with one node per kernel."""
    nodes = [{"id": i, "op": op, "module": f"l{i}", "layer_type": "mlp", "flops": f}
             for i, (op, f, _, _, _) in enumerate(kernels)]
    ks = [{"anchor": i, "nodes": [i], "predicted_s": t, "traffic_bytes": b, "bound": bound}
          for i, (_, _, b, bound, t) in enumerate(kernels)]
    return {"nodes": nodes, "kernels": ks}


def _tags(workload, **kw):
    return Tags("analysis", **{"workload": workload, "hardware": "h100-sxm", "precision": "bf16", "phase": "prefill",
                               **kw})


def test_kernel_classes():
    assert kernel_class("aten.addmm.default@h.0.mlp.c_fc") == "gemm"
    assert kernel_class("aten.bmm.default@") == "gemm"
    assert kernel_class("aten.convolution.default@layer1.0.conv1") == "conv"
    assert kernel_class("aten.scaled_dot_product_attention.default@h.0.attn") == "attention"
    assert kernel_class("aten.gelu.default@h.0.mlp") == "elementwise"
    assert kernel_class("aten.native_layer_norm.default@h.0.ln_1") == "native_layer_norm"


def test_a_square_gemm_does_not_stand_for_skinny_decode_gemms(tmp_path):
    path = tmp_path / "runs.duckdb"
    # synthetic: a 4096^3 bf16 GEMM, intensity 2 x 4096^3 / (2 x 3 x 4096^2) = 4096 / 3 = 1365 FLOP/B, compute-bound
    f, b = _gemm(4096, 4096, 4096)
    assert f / b == pytest.approx(4096 / 3)
    s = record("analyze", _run([("aten.mm.default", f, b, "compute", 1.0e-4)]), _tags("gemm.py:square"), path)
    # production: prefill GEMMs m=2048, n=k=4096 (intensity 1 / (1/4096 + 1/4096 + 1/2048) = 1024, within x2 of
    # 1365: represented) and decode GEMMs m=16 (intensity ~ 15.9: memory-bound, not represented), plus a norm
    pf, pb = _gemm(2048, 4096, 4096)
    df, db = _gemm(16, 4096, 4096)
    assert pf / pb == pytest.approx(1024) and df / db == pytest.approx(1 / (1 / 4096 + 1 / 4096 + 1 / 16))
    prod = record("analyze", _run([("aten.mm.default", pf, pb, "compute", 3e-4),
                                   ("aten.mm.default", df, db, "memory", 1e-4),
                                   ("aten.native_layer_norm.default", 1e6, 1e6, "memory", 1e-4)]),
                  _tags("llama"), path)
    r = production_check(s, prod, path)
    (g,) = r.classes
    assert g.name == "gemm" and g.production_kernels == 2 and g.represented_kernels == 1
    assert g.production_share == pytest.approx(4e-4 / 5e-4)  # GEMMs: 0.4 of the 0.5 ms total
    assert g.represented_share_of_class == pytest.approx(3e-4 / 4e-4)  # 0.75: below 0.8, "partly"
    assert g.represented_share_of_total == pytest.approx(3e-4 / 5e-4)
    assert g.verdict == "partly"
    assert dict(g.production_bound_mix) == pytest.approx({"compute": 0.75, "memory": 0.25})
    # the JSON the store records: the class under "class", no carried change without a synthetic comparison
    (row,) = record_json(r)["classes"]
    assert row["class"] == "gemm" and "expected_production_change" not in row
    # time-weighted quantiles: 25% of the time at ~15.9 FLOP/B, 75% at 1024
    p10, p50, p90 = g.production_intensity_p10_p50_p90
    assert p10 == pytest.approx(df / db) and p50 == pytest.approx(1024) and p90 == pytest.approx(1024)


def test_a_synthetic_win_is_carried_over_only_through_represented_kernels(tmp_path):
    path = tmp_path / "runs.duckdb"
    f, b = _gemm(4096, 4096, 4096)
    a = record("analyze", _run([("aten.mm.default", f, b, "compute", 1.0e-4)]), _tags("gemm.py:square"), path)
    # the tuned synthetic: the same GEMM 20% faster
    bb = record("analyze", _run([("aten.mm.default", f, b, "compute", 0.8e-4)]), _tags("gemm.py:square"), path)
    pf, pb = _gemm(2048, 4096, 4096)
    df, db = _gemm(16, 4096, 4096)
    prod = record("analyze", _run([("aten.mm.default", pf, pb, "compute", 3e-4),
                                   ("aten.mm.default", df, db, "memory", 1e-4),
                                   ("aten.native_layer_norm.default", 1e6, 1e6, "memory", 1e-4)]),
                  _tags("llama"), path)
    from opmap.store.shapes import class_changes

    change = class_changes(compare(a, bb, path))
    assert change == {"gemm": pytest.approx(-0.2)}
    r = production_check(a, prod, path, synthetic_change=change)
    # Amdahl over the represented kernels only: -20% x (0.3 ms of 0.5 ms) = -12% of the production total,
    # not -20% x 0.8 (all GEMMs) = -16%
    assert r.expected_production_change == pytest.approx(-0.2 * 0.6)
    d = record_json(r)
    assert d["expected_production_change"] == r.expected_production_change
    # the JSON's shape, key for key as the check's to_dict wrote it before it was declared (a stable output): the
    # times paired, each class a row with its carried change last
    assert list(d) == ["synthetic", "production", "forced_tags", "times", "rule", "classes",
                       "expected_production_change"]
    assert d["times"] == {"synthetic": "predicted", "production": "predicted"}
    assert list(d["classes"][0]) == [
        "class", "synthetic_kernels", "synthetic_bound", "synthetic_intensity", "production_kernels",
        "production_share", "represented_kernels", "represented_share_of_class", "represented_share_of_total",
        "production_intensity_p10_p50_p90", "production_bound_mix", "verdict", "synthetic_change",
        "expected_production_change"]
    assert d["classes"][0]["production_bound_mix"] == pytest.approx({"compute": 0.75, "memory": 0.25})


def test_mismatched_hardware_is_refused(tmp_path):
    path = tmp_path / "runs.duckdb"
    f, b = _gemm(1024, 1024, 1024)
    s = record("analyze", _run([("aten.mm.default", f, b, "compute", 1e-5)]), _tags("g.py:g"), path)
    p = record("analyze", _run([("aten.mm.default", f, b, "compute", 1e-5)]), _tags("m", hardware="a100-sxm-80gb"),
               path)
    with pytest.raises(OpmapError, match="hardware"):
        production_check(s, p, path)
    assert production_check(s, p, path, force=True).classes[0].verdict == "carries over"
