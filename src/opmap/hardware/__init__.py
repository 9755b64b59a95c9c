"""Hardware specs: the catalog (one TOML file per device) and its loader."""

from opmap.hardware.spec import DTYPES, KINDS, HardwareSpec, Value, catalog, get_hardware, load_spec_file

__all__ = ["DTYPES", "KINDS", "HardwareSpec", "Value", "catalog", "get_hardware", "load_spec_file"]
