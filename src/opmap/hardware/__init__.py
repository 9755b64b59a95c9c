"""Hardware specs: the catalog (one TOML file per device) and its loader."""

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
           "load_spec_file"]
