"""The interconnect as ordered tiers (opmap.hardware.interconnect): read from [[interconnect.tier]] tables, the flat
form of older device files still read to the same tiers, and bad tiers refused in one line."""

from __future__ import annotations

import pytest

from opmap.errors import OpmapError
from opmap.hardware.spec import CATALOG_DIR, catalog, parse_spec_toml

GOOD = (CATALOG_DIR / "h100-sxm.toml").read_text().split("\n[calibration]")[0]
MARK = "# the interconnect, innermost tier first"
BASE = GOOD.split(MARK)[0]
TIERED = GOOD[GOOD.index(MARK):].split("\n# NVIDIA's measured")[0]

# the H100 SXM's interconnect in the flat form of device files written before the tiers
FLAT = """
[devices_per_node]
value = 8
kind = "datasheet"
source = "NVIDIA DGX H100 datasheet: GPU 8x NVIDIA H100 Tensor Core GPUs"

[scale_up_bandwidth_bytes_per_s]
value = 900e9
kind = "datasheet"
source = "NVIDIA H100 datasheet (2023), H100 SXM: interconnect NVLink 900GB/s"

[scale_up_topology]
value = "switch"
kind = "datasheet"
source = "NVIDIA DGX H100 datasheet: 4x NVIDIA NVSwitches"

[scale_up_latency_s]
value = 6e-07
kind = "assumed"
source = "NVIDIA/nccl src/graph/tuning.cc: hwLat NVLINK, Ring, LL = 0.6 us"

[in_switch_reduction]
value = 1
kind = "datasheet"
source = "NVIDIA NVLink and NVSwitch page"

[in_switch_bandwidth_bytes_per_s]
value = 274200000000.0
kind = "measured"
source = "NVIDIA/dgxc-benchmarking nccl/README.md"

[scale_out_bandwidth_bytes_per_s]
value = 50e9
kind = "datasheet"
source = "NVIDIA DGX H100 datasheet: 8x ConnectX-7 400Gb/s"

[scale_out_latency_s]
value = 2.7e-06
kind = "assumed"
source = "NVIDIA/nccl src/graph/tuning.cc: hwLat NET, Ring, LL = 2.7 us"
"""


def _refused(text: str) -> str:
    with pytest.raises(OpmapError) as e:
        parse_spec_toml(text, "dev.toml")
    return str(e.value)


def test_h100_tiers_from_the_catalog():
    ic = catalog()["h100-sxm"].interconnect
    assert [t.name for t in ic.tiers] == ["nvlink", "infiniband"]
    up, out = ic.tiers
    assert up.devices == 8 and ic.domain_size == 8  # DGX H100: 8 GPUs on 4 NVSwitches
    assert up.bytes_per_s == 450e9  # 900 GB/s bidirectional (H100 datasheet) / 2 directions
    assert up.latency_s == 0.6e-6 and up.topology_name == "switch" and up.reduces_in_network
    assert up.in_network_bytes_per_s == 274.2e9  # 479.84 GB/s busbw x 8/14 (dgxc-benchmarking)
    assert out.devices is None and out.any_size and out.bytes_per_s == 50e9  # 400 Gb/s ConnectX-7 per GPU
    assert out.latency_s == 2.7e-6 and not out.reduces_in_network


def test_the_flat_form_reads_to_the_same_tiers():
    flat = parse_spec_toml(BASE + FLAT, "dev.toml")
    tiered = parse_spec_toml(GOOD, "dev.toml")
    for a, b in zip(flat.interconnect.tiers, tiered.interconnect.tiers, strict=True):
        assert (a.devices, a.bytes_per_s, a.latency_s, a.topology_name, a.reduces_in_network,
                a.in_network_bytes_per_s, a.any_size) == (b.devices, b.bytes_per_s, b.latency_s, b.topology_name,
                                                          b.reduces_in_network, b.in_network_bytes_per_s, b.any_size)
    assert [k for k in flat.fields] == [k for k in tiered.fields]  # the flat view in the same order
    assert {k: v.value for k, v in flat.fields.items()} == {k: v.value for k, v in tiered.fields.items()}


def test_both_forms_at_once_are_refused():
    msg = _refused(GOOD + "\n[scale_out_latency_s]\nvalue = 1e-6\nkind = \"assumed\"\nsource = \"x\"\n")
    assert msg == ("dev.toml: give the interconnect as [[interconnect.tier]] tables or as the flat fields, not both "
                   "(flat: scale_out_latency_s)")


def _tiers(*bodies: str) -> str:
    return BASE + "".join(f'\n[[interconnect.tier]]\nname = "t{i}"\n{b}\n' for i, b in enumerate(bodies))


SIZE = '[interconnect.tier.size]\nvalue = {}\nkind = "assumed"\nsource = "a hypothetical domain"\n'


def test_size_any_is_for_the_outermost_tier_only():
    assert _refused(_tiers('size = "any"', SIZE.format(8))).endswith(
        "interconnect.tier[0]: size 'any' (the scale-out network) is for the outermost tier only")


def test_tier_sizes_grow_in_multiples():
    assert _refused(_tiers(SIZE.format(8), SIZE.format(12))).endswith(
        "each tier's size must be a larger multiple of the one inside it (got 8, 12)")
    assert _refused(_tiers(SIZE.format(8), SIZE.format(8))).endswith("(got 8, 8)")
    three = parse_spec_toml(_tiers(SIZE.format(4), SIZE.format(16), 'size = "any"'), "dev.toml")
    assert [t.devices for t in three.interconnect.tiers] == [4, 16, None]


def test_unknown_tier_keys_and_directions_are_refused():
    assert "unknown key(s) speed" in _refused(_tiers('speed = 1'))
    assert _refused(_tiers('bandwidth_directions = 3')).endswith("bandwidth_directions must be 1 or 2 (got 3)")
    assert _refused(BASE + "\n[interconnect]\nx = 1\n").endswith(
        "interconnect: expected one or more [[interconnect.tier]] tables, innermost first")


@pytest.mark.parametrize("name, domain, fabric", [
    ("h100-sxm", 8, 8),  # DGX H100: 8 GPUs on NVSwitch
    ("b200", 8, 8),  # DGX B200: 8 GPUs, 2 NVLink switches
    ("gb200", 72, 72),  # GB200 NVL72: 72 GPUs in one NVLink domain
    ("gb300", 72, 72),  # GB300 NVL72: the same NVLink Switch System
    ("tpu-v6e", 256, 256),  # Cloud TPU v6e: a 256-chip pod on ICI
    ("tpu-v7", 9216, 9216),  # TPU7x (Ironwood): 9,216 chips a pod
    ("trn2", 16, 64),  # a trn2-16 instance's 4x4 torus inside a u-trn2x64 UltraServer's 64 chips
])
def test_scale_up_domain_and_fabric_from_the_catalog(name, domain, fabric):
    """The innermost tier's domain (a node) and the scale-up fabric (the outermost bounded tier, where a replica's
    TP x PP x EP group is placed), as the catalog files cite them."""
    ic = catalog()[name].interconnect
    assert (ic.domain_size, ic.fabric_size) == (domain, fabric)
    assert all(t.size.source for t in ic.bounded)  # every domain size carries its source
    assert ic.scale_out is not None and ic.scale_out not in ic.bounded
