"""The shipped hardware catalog: every device loads, carries dense peaks, and matches its datasheet."""

from __future__ import annotations

import math

import pytest

import opmap.hardware
from opmap.errors import OpmapError
from opmap.hardware import KINDS, catalog, load_spec_file

NAMES = {
    "h100-sxm", "h100-pcie", "h200", "b200", "a100-sxm-80gb", "a100-pcie-40gb", "l4", "l40s",
    "mi300x", "mi250x", "tpu-v5e", "tpu-v5p", "gaudi2", "gaudi3", "xeon-8480", "epyc-9654",
}


@pytest.fixture(scope="module")
def specs():
    return catalog()


def test_all_devices_present(specs):
    assert NAMES <= set(specs), f"missing: {sorted(NAMES - set(specs))}"


def test_every_spec_has_bf16_or_fp32_matrix_peak(specs):
    for name, spec in specs.items():
        dtypes = spec.matrix_dtypes()
        assert "bf16" in dtypes or "fp32" in dtypes, name


def test_required_values_and_vector_fp32(specs):
    for name, spec in specs.items():
        assert spec.memory_bandwidth_bytes_per_s > 0, name
        assert spec.launch_overhead_s > 0, name
        assert spec.memory_bytes > 0, name
        assert spec.vector_peak_flops_per_s["fp32"].value > 0, name
        assert spec.device_type in {"gpu", "cpu", "tpu", "accelerator"}, name


def test_every_value_has_kind_and_source(specs):
    for name, spec in specs.items():
        tables = [spec.matrix_peak_flops_per_s, spec.sparse_matrix_peak_flops_per_s,
                  spec.vector_peak_flops_per_s, spec.fields]
        for table in tables:
            for key, v in table.items():
                assert v.kind in KINDS, (name, key)
                assert v.source.strip(), (name, key)
                if key == "idle_power_w" and spec.tdp_w is None:
                    continue  # no TDP and no published idle (TPUs): empty, the source says why
                assert v.value is not None, (name, key)


# (device, accessor, expected, source of the expected figure)
SPOT_CHECKS = [
    # NVIDIA H100 datasheet (2023), H100 SXM: BF16 1,979 TFLOPS with sparsity -> 989.4 dense (whitepaper)
    ("h100-sxm", ("matrix", "bf16"), 989.4e12),
    # NVIDIA H100 datasheet, H100 SXM: FP8 3,958 TFLOPS with sparsity -> 1978.9 dense
    ("h100-sxm", ("matrix", "fp8"), 1978.9e12),
    # NVIDIA H100 datasheet, H100 SXM: GPU memory bandwidth 3.35 TB/s
    ("h100-sxm", ("field", "memory_bandwidth_bytes_per_s"), 3.35e12),
    # NVIDIA H100 datasheet, H100 SXM: NVLink 900 GB/s
    ("h100-sxm", ("field", "scale_up_bandwidth_bytes_per_s"), 900e9),
    # NVIDIA H100 datasheet, H100 PCIe: BF16 1,513 TFLOPS with sparsity -> 756.5 dense
    ("h100-pcie", ("matrix", "bf16"), 756.5e12),
    # NVIDIA H200 datasheet (2024): GPU memory 141 GB of HBM3e, a binary figure as HBM is: 141 x 2**30 B
    # (nvidia-smi shows 143771 MiB of it after the driver's reserve)
    ("h200", ("field", "memory_bytes"), 141 * 2**30),
    # NVIDIA H100 datasheet: 80GB HBM3 = 80 x 2**30 = 85.9e9 B (nvidia-smi: 81559 MiB usable)
    ("h100-sxm", ("field", "memory_bytes"), 80 * 2**30),
    # AMD MI300X datasheet: 192 GB HBM3 = 8 stacks x 24 GiB = 192 x 2**30 B (rocm-smi: 205822885888 B)
    ("mi300x", ("field", "memory_bytes"), 192 * 2**30),
    # NVIDIA H200 datasheet (2024): GPU memory bandwidth 4.8 TB/s
    ("h200", ("field", "memory_bandwidth_bytes_per_s"), 4.8e12),
    # NVIDIA HGX B200 per-GPU: FP16/BF16 Tensor Core 4.5 PFLOPS with sparsity -> 2.25 dense
    ("b200", ("matrix", "bf16"), 2.25e15),
    # NVIDIA A100 datasheet, 80GB SXM: BFLOAT16 Tensor Core 312 TFLOPS (dense)
    ("a100-sxm-80gb", ("matrix", "bf16"), 312e12),
    # NVIDIA A100 datasheet, 80GB SXM: GPU memory bandwidth 2,039 GB/s
    ("a100-sxm-80gb", ("field", "memory_bandwidth_bytes_per_s"), 2.039e12),
    # NVIDIA A100 datasheet, 80GB SXM: FP32 19.5 TFLOPS (CUDA cores)
    ("a100-sxm-80gb", ("vector", "fp32"), 19.5e12),
    # NVIDIA A100 datasheet, 40GB PCIe: GPU memory bandwidth 1,555 GB/s
    ("a100-pcie-40gb", ("field", "memory_bandwidth_bytes_per_s"), 1.555e12),
    # NVIDIA L4 datasheet (2023): max TDP 72 W
    ("l4", ("field", "tdp_w"), 72),
    # NVIDIA L4 datasheet (2023): memory bandwidth 300 GB/s
    ("l4", ("field", "memory_bandwidth_bytes_per_s"), 300e9),
    # NVIDIA L40S datasheet (2023): FP8 Tensor Core 733 | 1,466* TFLOPS
    ("l40s", ("matrix", "fp8"), 733e12),
    # AMD Instinct MI300X datasheet: peak memory bandwidth 5.3 TB/s
    ("mi300x", ("field", "memory_bandwidth_bytes_per_s"), 5.3e12),
    # AMD Instinct MI300X datasheet: peak bfloat16 1307.4 TFLOPs (dense)
    ("mi300x", ("matrix", "bf16"), 1307.4e12),
    # AMD Instinct MI300X datasheet: 304 compute units
    ("mi300x", ("field", "compute_units"), 304),
    # AMD Instinct MI250X datasheet: peak FP16 383 TFLOPs
    ("mi250x", ("matrix", "fp16"), 383e12),
    # Google Cloud TPU v5e docs: peak compute per chip (bf16) 197 TFLOPs; HBM bandwidth 819 GBps
    ("tpu-v5e", ("matrix", "bf16"), 197e12),
    ("tpu-v5e", ("field", "memory_bandwidth_bytes_per_s"), 819e9),
    # Google Cloud TPU v5p docs: peak compute per chip (BF16) 459 TFLOPs; HBM bandwidth 2765 GBps
    ("tpu-v5p", ("matrix", "bf16"), 459e12),
    ("tpu-v5p", ("field", "memory_bandwidth_bytes_per_s"), 2765e9),
    # Intel Gaudi 3 (Hot Chips 2024): BF16 matrix 1835 TFLOPs; HBM bandwidth 3.67 TB/s
    ("gaudi3", ("matrix", "bf16"), 1835e12),
    ("gaudi3", ("field", "memory_bandwidth_bytes_per_s"), 3.67e12),
    # Intel Gaudi 2: BF16 MME 432 TFLOPs (Gaudi 3 white paper comparison)
    ("gaudi2", ("matrix", "bf16"), 432e12),
    # Xeon 8480+: 56 cores x 1024 AMX BF16 FLOP/cycle x 2.0 GHz base (derived)
    ("xeon-8480", ("matrix", "bf16"), 56 * 1024 * 2.0e9),
    # EPYC 9654 spec: 12 x DDR5-4800 = 460.8 GB/s per socket
    ("epyc-9654", ("field", "memory_bandwidth_bytes_per_s"), 460.8e9),
]


def _lookup(spec, accessor):
    table, key = accessor
    if table == "matrix":
        return spec.matrix_peak_flops_per_s[key].value
    if table == "vector":
        return spec.vector_peak_flops_per_s[key].value
    return getattr(spec, key)


@pytest.mark.parametrize(("name", "accessor", "expected"), SPOT_CHECKS,
                         ids=[f"{n}-{a[1]}" for n, a, _ in SPOT_CHECKS])
def test_datasheet_spot_checks(specs, name, accessor, expected):
    got = _lookup(specs[name], accessor)
    assert got is not None, (name, accessor)
    assert math.isclose(got, expected, rel_tol=0.01), (name, accessor, got, expected)


def test_matrix_peaks_are_dense(specs):
    for name, spec in specs.items():
        for dtype, v in spec.matrix_peak_flops_per_s.items():
            assert v.kind != "datasheet_sparse", (name, dtype)
        for dtype, v in spec.sparse_matrix_peak_flops_per_s.items():
            assert v.kind == "datasheet_sparse", (name, dtype)


def test_sparse_over_dense_equals_sparsity_factor(specs):
    checked = 0
    for name, spec in specs.items():
        factor = spec.sparsity_factor
        if spec.sparse_matrix_peak_flops_per_s:
            assert factor, f"{name}: sparse peaks without a sparsity_factor"
        for dtype, sparse in spec.sparse_matrix_peak_flops_per_s.items():
            dense = spec.matrix_peak_flops_per_s.get(dtype)
            if dense is None or not dense.value:
                continue
            assert math.isclose(sparse.value / dense.value, factor, rel_tol=0.01), (name, dtype)
            checked += 1
    assert checked >= 20


def test_validator_rejects_bad_kind(tmp_path):
    good = (opmap.hardware.spec.CATALOG_DIR / "h100-sxm.toml").read_text()
    bad = good.replace('kind = "datasheet"', 'kind = "guess"', 1)
    assert bad != good
    path = tmp_path / "bad.toml"
    path.write_text(bad)
    with pytest.raises(OpmapError, match="guess"):
        load_spec_file(path)


def test_validator_rejects_minimal_bad_file(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(
        'name = "tiny"\ndisplay_name = "Tiny"\nvendor = "x"\ndevice_type = "gpu"\n'
        '[matrix_peak_flops_per_s.bf16]\nvalue = 1e12\nkind = "guess"\nsource = "made up"\n'
        '[vector_peak_flops_per_s.fp32]\nvalue = 1e11\nkind = "datasheet"\nsource = "x"\n'
        '[memory_bytes]\nvalue = 1e9\nkind = "datasheet"\nsource = "x"\n'
        '[memory_bandwidth_bytes_per_s]\nvalue = 1e11\nkind = "datasheet"\nsource = "x"\n'
        '[launch_overhead_s]\nvalue = 1e-6\nkind = "assumed"\nsource = "x"\n'
    )
    with pytest.raises(OpmapError):
        load_spec_file(path)


@pytest.mark.parametrize("name,expected", [
    ("H200", "h200"), ("h200", "h200"), ("B200", "b200"), ("H100-SXM", "h100-sxm"), (" l40s ", "l40s"),
    ("h100", "h100-sxm"), ("H100", "h100-sxm"), ("a100", "a100-sxm-80gb"), ("MI300", "mi300x"),
    ("mi250", "mi250x"),
])
def test_names_any_case_and_aliases(name, expected):
    assert opmap.hardware.get_hardware(name).name == expected
    assert bool(opmap.hardware.alias_note(name)) == (name.strip().lower() in opmap.hardware.ALIASES)


def test_l40_is_not_an_alias_of_l40s():
    with pytest.raises(OpmapError, match="unknown hardware 'l40'"):
        opmap.hardware.get_hardware("l40")
    assert opmap.hardware.alias_note("l40") == ""


def test_sustained_rates_need_a_power_window_and_a_measurement(tmp_path):
    good = (opmap.hardware.spec.CATALOG_DIR / "l4.toml").read_text()
    start = good.index("[power_window_s]")
    no_window = good[:start] + good[good.index("\n\n", start) + 2:]
    path = tmp_path / "l4.toml"
    path.write_text(no_window)
    with pytest.raises(OpmapError, match="power_window_s"):
        load_spec_file(path)
    path.write_text(good.replace('[sustained_matrix_flops_per_s.fp16]\nvalue = 52470000000000.0\nkind = "measured"',
                                 '[sustained_matrix_flops_per_s.fp16]\nvalue = 52470000000000.0\nkind = "assumed"'))
    with pytest.raises(OpmapError, match="sustained_matrix_flops_per_s.fp16 must be kind measured or derived"):
        load_spec_file(path)


def test_power_limited_cards_sustain_less_than_they_boost(specs):
    # a sustained rate above the boost (achievable) one would make a long run faster than a short one
    for s in specs.values():
        for dt, v in s.sustained_matrix_flops_per_s.items():
            boost = s.achievable_matrix_flops_per_s.get(dt)
            if boost is not None:
                assert v.value <= boost.value, (s.name, dt)

# Collective fields (mapping/collectives.py): node sizes and topologies from the platform datasheets
COLLECTIVE_CHECKS = [
    # NVIDIA DGX H100 / H200 / B200 / A100 datasheets: 8 GPUs per system, NVSwitch
    ("h100-sxm", 8, "switch", True), ("h200", 8, "switch", True), ("b200", 8, "switch", True),
    ("a100-sxm-80gb", 8, "switch", False),  # NVSwitch 2: no SHARP
    # AMD Instinct MI300X Platform: 8 GPUs, each with a link to every other
    ("mi300x", 8, "full_mesh", False),
    # HLS-Gaudi2 / HLS-3: 8 devices, all-to-all RoCE ports
    ("gaudi2", 8, "full_mesh", False), ("gaudi3", 8, "full_mesh", False),
    # Google Cloud TPU docs: v5e pod 256 chips (2D torus), v5p pod 8960 chips (3D torus)
    ("tpu-v5e", 256, "torus", False), ("tpu-v5p", 8960, "torus", False),
    # PCIe cards: 8 per server assumed (kind "assumed")
    ("l4", 8, "pcie", False), ("h100-pcie", 8, "bridge_pairs", False),
]


@pytest.mark.parametrize(("name", "per_node", "topology", "sharp"), COLLECTIVE_CHECKS,
                         ids=[c[0] for c in COLLECTIVE_CHECKS])
def test_collective_fields(specs, name, per_node, topology, sharp):
    s = specs[name]
    assert s.devices_per_node == per_node
    assert s.scale_up_topology == topology
    assert s.in_switch_reduction is sharp
    if sharp:
        assert s.in_switch_bandwidth_bytes_per_s > 0


def test_pcie_node_sizes_are_marked_assumed(specs):
    for name in ("l4", "l40s", "h100-pcie", "a100-pcie-40gb"):
        assert specs[name].fields["devices_per_node"].kind == "assumed", name


def test_nvlink_hop_latency_is_nccls(specs):
    # NVIDIA/nccl src/graph/tuning.cc: hwLat NVLINK Ring LL 0.6 us, NET Ring LL 2.7 us
    assert math.isclose(specs["h100-sxm"].scale_up_latency_s, 0.6e-6)
    assert math.isclose(specs["h100-sxm"].scale_out_latency_s, 2.7e-6)


def test_in_switch_rate_below_the_link(specs):
    """An in-switch all-reduce moves S each way per device: its rate cannot pass the per-direction link rate."""
    for name, s in specs.items():
        if s.in_switch_bandwidth_bytes_per_s:
            assert s.in_switch_bandwidth_bytes_per_s <= s.scale_up_bandwidth_bytes_per_s / 2, name


def test_validator_rejects_an_unknown_topology(tmp_path):
    good = (opmap.hardware.spec.CATALOG_DIR / "h100-sxm.toml").read_text()
    bad = good.replace('value = "switch"', 'value = "hypercube"', 1)
    assert bad != good
    path = tmp_path / "bad.toml"
    path.write_text(bad)
    with pytest.raises(OpmapError, match="hypercube.*switch, full_mesh"):
        load_spec_file(path)


def test_every_device_has_sourced_idle_power_and_risk(specs):
    from opmap.hardware.spec import RISK_LEVELS

    for name, s in specs.items():
        idle, risk = s.fields.get("idle_power_w"), s.fields.get("software_risk")
        assert idle is not None and idle.kind in ("measured", "datasheet", "estimate"), name
        assert risk is not None and s.software_risk in RISK_LEVELS and len(risk.source) > 40, name
        if idle.kind == "estimate":  # never silent: the source says how the figure was reached
            assert "no published" in idle.source or "publishes neither" in idle.source, name
        if s.tdp_w is not None:
            assert s.idle_power_w is not None and 0 < s.idle_power_w < s.tdp_w, name


def test_h200_idle_is_the_published_measurement(specs):
    # ALICE GPU Energy Benchmark (api.serialalice.pt/alice-benchmark): H200 SXM, 80.3 W idle vs 592.8 W at load
    h200 = specs["h200"].fields["idle_power_w"]
    assert h200.value == 80.3 and h200.kind == "measured"
    # the H100 SXM shares the GH100 die and 700 W board: the H200's idle share (80.3 / 700) x 700 W
    assert specs["h100-sxm"].idle_power_w == pytest.approx(80.3 / 700 * 700, abs=0.05)
    # L4: 80.3 / 700 x 72 W TDP (NVIDIA L4 datasheet) = 8.26 W
    assert specs["l4"].idle_power_w == pytest.approx(80.3 / 700 * 72, abs=0.05)


def test_scalar_field_names_carry_their_units():
    from opmap.hardware.spec import SCALAR_FIELDS

    suffix = {"W": "_w", "s": "_s", "B": "_bytes", "B/s": "_bytes_per_s", "Hz": "_hz", "B/clk": "_per_clk",
              "/clk": "_per_clk"}
    for key, unit in SCALAR_FIELDS.items():
        if unit in suffix:
            assert key.endswith(suffix[unit]), (key, unit)


@pytest.mark.parametrize("edit,match", [
    (('[software_risk]\nvalue = "low"', '[software_risk]\nvalue = "none"'), "'none' is not one of low, medium, high"),
    (('[idle_power_w]\nvalue = 80.3', '[idle_power_w]\nvalue = 900.0'), "idle_power_w 900 W must be below tdp_w 700 W"),
])
def test_validator_rejects_bad_risk_and_idle_over_tdp(tmp_path, edit, match):
    good = (opmap.hardware.spec.CATALOG_DIR / "h200.toml").read_text()
    bad = good.replace(*edit)
    assert bad != good
    path = tmp_path / "h200.toml"
    path.write_text(bad)
    with pytest.raises(OpmapError, match=match):
        load_spec_file(path)


# Device memory in the unit vendors state it: HBM (and GDDR) capacity is binary, 2**30 B a GB; the figure a
# driver reports sits just below it (its reserve), never above. (device, datasheet "GB", what nvidia-smi / rocm-smi /
# hl-smi report in bytes, from the sources the catalog cites)
CAPACITIES = [
    ("h100-sxm", 80, 81559 * 2**20), ("h200", 141, 143771 * 2**20), ("b200", 180, 183359 * 2**20),
    ("a100-sxm-80gb", 80, 81920 * 2**20), ("a100-pcie-40gb", 40, 40960 * 2**20),
    ("mi300x", 192, 205822885888), ("mi250x", 128, 2 * 68702699520), ("gaudi2", 96, 98304 * 2**20),
    ("l4", 24, 23034 * 2**20), ("l40s", 48, 46068 * 2**20),
]


@pytest.mark.parametrize(("name", "gb", "reported"), CAPACITIES, ids=[c[0] for c in CAPACITIES])
def test_device_memory_is_binary_and_at_least_what_the_driver_reports(specs, name, gb, reported):
    cap = specs[name].memory_bytes
    assert cap == gb * 2**30
    assert reported <= cap < reported * 1.07  # the reserve (or GDDR6's 1/16 ECC) is a few percent at most


def test_cpus_keep_their_dimm_capacity_as_stated(specs):
    # AMD EPYC 9654 spec: max memory 6 TB; Intel ARK Xeon 8480+: 4 TB (decimal, as the vendor states DIMM totals)
    assert specs["epyc-9654"].memory_bytes == 6e12 and specs["xeon-8480"].memory_bytes == 4e12


# Achievable figures (like for like): (device, achievable bf16 FLOP/s or None, achievable B/s or None) with where
# each comes from. None: no published measurement or defensible derivation; the device is "datasheet only" there.
ACHIEVABLE = [
    # Bekman MAMF table: H100 SXM 794.5 TFLOPS; Azure ND H100 v5 BabelStream Triad 2.97 TB/s
    ("h100-sxm", 794.5e12, 2.97e12),
    # MAMF: "H200 is the same" as the H100 SXM row; Azure ND H200 v5 Triad 4.15 TB/s
    ("h200", 794.5e12, 4.15e12),
    # MAMF A100 SXM 271.2; Azure ND A100 v4 (A100-SXM4-80GB) Triad 1.70 TB/s
    ("a100-sxm-80gb", 271.2e12, 1.70e12),
    # MAMF A100 PCIe 252.9; gpu-benches gpu-stream on an A100 40GB, triad at 100% occupancy 1360 GB/s
    ("a100-pcie-40gb", 252.9e12, 1.36e12),
    # L40S: crowd-sourced torch.mm 269.15; bandwidth: gpu-benches gpu-stream on an L40 (the same memory system),
    # triad at 100% occupancy 768 GB/s
    ("l40s", 269.15e12, 768e9),
    # H100 PCIe: crowd-sourced torch.mm 495.93; bandwidth derived: the SXM part's 2.97 / 3.35 times 2.0 TB/s
    ("h100-pcie", 495.93e12, 2.0e12 * 2.97 / 3.35),
    # MAMF MI300X 668.4; AMD's MI300X acceptance guide, expected BabelStream Triad 3,948,062 MB/s
    ("mi300x", 668.4e12, 3.948e12),
    # MAMF Gaudi 2 418.7, Gaudi 3 1243.0; no published STREAM-like figure found for them
    ("gaudi2", 418.7e12, None), ("gaudi3", 1243.0e12, None),
    # MAMF B200 1745.0; Tilebench's frozen B200 calibration (empirical/B200.json): peak_bw_GBs 6840.43, a Triton
    # streaming copy over 4 GiB
    ("b200", 1745.0e12, 6840.43e9),
    # no published achievable matrix rate nor streaming figure found
    ("mi250x", None, None), ("tpu-v5e", None, None), ("tpu-v5p", None, None),
]


@pytest.mark.parametrize(("name", "matrix", "bandwidth"), ACHIEVABLE, ids=[a[0] for a in ACHIEVABLE])
def test_achievable_figures_and_datasheet_only(specs, name, matrix, bandwidth):
    s = specs[name]
    got = s.achievable_matrix_flops_per_s.get("bf16")
    assert (got.value if got else None) == (pytest.approx(matrix) if matrix else None)
    bw = s.fields.get("achievable_memory_bandwidth_bytes_per_s")
    assert (bw.value if bw else None) == (pytest.approx(bandwidth, rel=1e-4) if bandwidth else None)  # 5 digits
    missing = {"achievable_matrix_flops_per_s"} if matrix is None else set()
    missing |= {"achievable_memory_bandwidth_bytes_per_s"} if bandwidth is None else set()
    assert set(s.datasheet_only) == missing
    if bandwidth is None and s.device_type != "cpu":
        # the fallback stays: DRAM_EFFICIENCY (FlashMLA's 3000 of 3350 GB/s) of the datasheet pin rate, and says so
        assert s.memory_rate_bytes_per_s == pytest.approx(s.memory_bandwidth_bytes_per_s * 3000 / 3350)
        assert "FlashMLA" in s.memory_rate_basis
    elif bandwidth is not None:
        assert s.memory_rate_bytes_per_s == pytest.approx(bandwidth, rel=1e-4)
        assert s.memory_rate_bytes_per_s < s.memory_bandwidth_bytes_per_s


def test_every_achievable_figure_is_sourced_and_below_its_datasheet(specs):
    for name, s in specs.items():
        for d, v in s.achievable_matrix_flops_per_s.items():
            assert v.kind in ("measured", "derived", "estimate") and v.source.strip(), (name, d)
            assert v.value <= s.matrix_peak_flops_per_s[d].value, (name, d)
        bw = s.fields.get("achievable_memory_bandwidth_bytes_per_s")
        if bw is not None:
            assert bw.kind in ("measured", "derived", "estimate") and bw.source.strip(), name
            assert bw.value < s.memory_bandwidth_bytes_per_s, name


def test_an_achievable_bandwidth_above_the_datasheet_is_refused(tmp_path):
    good = (opmap.hardware.spec.CATALOG_DIR / "h100-sxm.toml").read_text()
    path = tmp_path / "h100-sxm.toml"
    path.write_text(good.replace("[achievable_memory_bandwidth_bytes_per_s]\nvalue = 2.97e+12",
                                 "[achievable_memory_bandwidth_bytes_per_s]\nvalue = 3.5e+12"))
    with pytest.raises(OpmapError, match="achievable_memory_bandwidth_bytes_per_s .* is above the datasheet"):
        load_spec_file(path)
    path.write_text(good.replace('value = 2.97e+12\nkind = "measured"', 'value = 2.97e+12\nkind = "assumed"'))
    with pytest.raises(OpmapError, match="achievable_memory_bandwidth_bytes_per_s must be kind"):
        load_spec_file(path)


def test_every_measured_grid_file_is_a_devices_and_every_devices_curves_build(specs):
    """A catalog GEMM grid (<device>.gemm.json) belongs to the device of its name, which references it, and every
    device's curves load: a stray or broken file fails here, not deep in someone's analysis."""
    from opmap.hardware.spec import CATALOG_DIR

    grids = {p.name for p in CATALOG_DIR.glob("*.gemm.json")}
    referenced = {h.calibration.get("gemm_grid") for h in specs.values()} - {None}
    assert grids == referenced and grids
    for name, h in specs.items():
        assert h.calibration.get("gemm_grid") in (None, f"{name}.gemm.json")
        c = h.curves  # builds every table
        if h.calibration.get("gemm_grid"):
            # every grid's rates sit below the format's dense peak (the extractor drops impossible points)
            from opmap.ops import MatrixFamily

            for (fam, dt), t in c.tables.items():
                if fam == MatrixFamily.GEMM and hasattr(t, "log_rates"):
                    import math

                    assert math.exp(max(t.log_rates)) <= h.matrix_peak_flops_per_s[dt].value, (name, dt)


def test_tpu_ici_hop_latency_is_marked_assumed(specs):
    # no published per-hop ICI latency: 1 us, marked assumed (the catalog says so where it guesses)
    for name in ("tpu-v5e", "tpu-v5p"):
        f = specs[name].fields["scale_up_latency_s"]
        assert f.kind == "assumed" and math.isclose(specs[name].scale_up_latency_s, 1e-6), name



def test_every_device_with_a_scale_up_topology_can_price_a_collective(specs):
    # a collective inside a node needs the path's topology, bandwidth and per-step latency
    # (opmap.mapping.collectives refuses a device without them): where the catalog gives the topology it gives the
    # rest (the MI250X gives none on purpose: its in-node Infinity Fabric is not a mesh of equal links)
    for name, s in specs.items():
        if s.scale_up_topology:
            assert s.scale_up_bandwidth_bytes_per_s and s.scale_up_latency_s, name
    assert specs["mi250x"].scale_up_topology is None
