"""Hardware specs: the catalog (one TOML file per device) and its loader."""

from opmap.hardware.curves import attention_kernels, with_attention_dropout, with_attention_kernel
from opmap.hardware.spec import (
    ALIASES,
    DTYPES,
    KINDS,
    HardwareSpec,
    Value,
    alias_note,
    catalog,
    get_hardware,
    load_spec_file,
)

__all__ = ["ALIASES", "DTYPES", "KINDS", "HardwareSpec", "Value", "alias_note", "catalog", "get_hardware",
           "load_spec_file", "attention_kernels", "with_attention_dropout", "with_attention_kernel"]
