"""Each catalog device names its software stack (``software_stack``, a section of runtimes.toml); before, the stack
was chosen by a substring of the vendor's name."""

from __future__ import annotations

import pytest

from opmap.errors import OpmapError
from opmap.hardware.runtimes import stack_for, stacks
from opmap.hardware.spec import CATALOG_DIR, SOFTWARE_STACKS, catalog, parse_spec_toml

GOOD = (CATALOG_DIR / "h100-sxm.toml").read_text().split("\n[calibration]")[0]


def test_the_accepted_stacks_are_runtimes_toml_sections():
    assert set(SOFTWARE_STACKS) == set(stacks())


# the stack each vendor's devices ran on before (CUDA graphs on NVIDIA, HIP graphs on AMD Instinct, HPU graphs on
# Gaudi, XLA on TPU, eager PyTorch on a CPU): the same outcome, now named in each file
EXPECTED = {"a100-pcie-40gb": "cuda-graphs", "a100-sxm-80gb": "cuda-graphs", "b200": "cuda-graphs",
            "h100-pcie": "cuda-graphs", "h100-sxm": "cuda-graphs", "h200": "cuda-graphs", "l4": "cuda-graphs",
            "l40s": "cuda-graphs", "mi250x": "hip-graphs", "mi300x": "hip-graphs", "gaudi2": "hpu-graphs",
            "gaudi3": "hpu-graphs", "tpu-v5e": "xla", "tpu-v5p": "xla", "epyc-9654": "cpu", "xeon-8480": "cpu"}
# issue 37's cloud accelerators (tests/hardware/test_catalog_2026_cloud.py)
EXPECTED |= {"tpu-v6e": "xla", "trn2": "xla", "tpu-v7": "xla"}
# issue 37's AMD platforms (tests/hardware/test_catalog_2026_mi355x.py, _mi350x.py, _mi325x.py)
EXPECTED |= {"mi355x": "hip-graphs", "mi350x": "hip-graphs", "mi325x": "hip-graphs"}
# issue 37, the NVIDIA 2026 entries (i37-nv)
EXPECTED |= {"b300": "cuda-graphs", "gb200": "cuda-graphs", "gb300": "cuda-graphs",
             "h200-nvl": "cuda-graphs", "rtx-pro-6000": "cuda-graphs"}


def test_every_catalog_device_names_its_stack():
    specs = catalog()
    assert {n: s.software_stack for n, s in specs.items()} == EXPECTED
    assert {n: stack_for(s).name for n, s in specs.items()} == EXPECTED


def test_a_device_of_any_vendor_runs_the_stack_it_names():
    spec = parse_spec_toml(GOOD.replace('vendor = "NVIDIA"', 'vendor = "Acme"').replace(
        'software_stack = "cuda-graphs"', 'software_stack = "xla"'), "acme.toml")
    assert stack_for(spec).name == "xla"


def test_a_file_without_the_field_still_goes_by_its_vendor():
    spec = parse_spec_toml(GOOD.replace('software_stack = "cuda-graphs"', ""), "old.toml")
    assert spec.software_stack == "" and stack_for(spec).name == "cuda-graphs"
    acme = parse_spec_toml(GOOD.replace('software_stack = "cuda-graphs"', "").replace(
        'vendor = "NVIDIA"', 'vendor = "Acme"'), "acme.toml")
    with pytest.raises(OpmapError, match="no software_stack in its file and none known for vendor 'Acme'"):
        stack_for(acme)


def test_an_unknown_stack_is_refused():
    with pytest.raises(OpmapError) as e:
        parse_spec_toml(GOOD.replace('software_stack = "cuda-graphs"', 'software_stack = "rocm"'), "dev.toml")
    assert str(e.value) == ("dev.toml: software_stack 'rocm' is not one of cuda-graphs, hip-graphs, hpu-graphs, xla, "
                            "cpu (opmap/hardware/runtimes.toml)")
