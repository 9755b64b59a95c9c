"""Which catalog entry a measured device is: CUDA device names matched to catalog names."""

from __future__ import annotations

import re

# Catalog entries a CUDA device name maps to (torch.cuda.get_device_name spellings), most specific first.
# CPUs are not matched automatically: a datasheet peak is for a whole socket, a VM or a thread-limited run
# has a slice of it.
DATASHEET_MATCH = (
    ("h200", r"\bH200\b"), ("h100-pcie", r"\bH100\b.*PCIe"), ("h100-sxm", r"\bH100\b"), ("b200", r"\bB200\b"),
    ("a100-pcie-40gb", r"\bA100\b.*PCIE.*40GB"), ("a100-sxm-80gb", r"\bA100\b"), ("l40s", r"\bL40S\b"),
    ("l4", r"\bL4\b"), ("mi300x", r"MI300X"), ("mi250x", r"MI250X"),
)


def match_datasheet(device_name: str) -> str | None:
    """The catalog name for a CUDA device name, or None."""
    for name, pattern in DATASHEET_MATCH:
        if re.search(pattern, device_name, re.IGNORECASE):
            return name
    return None
