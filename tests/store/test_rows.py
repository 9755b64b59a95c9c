"""A calibration profile read back as a calibrate run's payload (opmap.store.rows.read_profile)."""

from __future__ import annotations

import pytest

from opmap.errors import OpmapError
from opmap.store.rows import read_profile


def test_a_profile_is_a_bounded_regular_file_never_read_through_a_link(tmp_path):
    """read_profile read any size and followed a link (/dev/zero: MemoryError). It reads the file calibrate wrote:
    a regular file of at most opmap.safeio.LIMIT_TOML_BYTES, no link followed."""
    from opmap.safeio import LIMIT_TOML_BYTES

    good = tmp_path / "local.toml"
    good.write_text('name = "local"\n[memory_bytes]\nvalue = 1e9\n')
    assert read_profile(good) == {"name": "local", "memory_bytes": {"value": 1e9}}
    link = tmp_path / "link.toml"
    link.symlink_to("/dev/zero")
    with pytest.raises(OpmapError, match=r"calibration profile .*link.toml is a symbolic link"):
        read_profile(link)
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:  # sparse: refused on its size, nothing read
        f.truncate(LIMIT_TOML_BYTES + 1)
    with pytest.raises(OpmapError, match=r"big.toml is 4.0 MiB, over the 4 MiB opmap reads for it"):
        read_profile(big)
