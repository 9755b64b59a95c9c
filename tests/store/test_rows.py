"""A calibration profile read back as a calibrate run: its payload and tags (opmap.store.rows.read_profile)."""

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
    run = read_profile(good, quick=True)
    assert run.payload == {"name": "local", "memory_bytes": {"value": 1e9}}
    # its tags: a calibrate run of this profile's device (no fingerprint in the file: its model unknown)
    assert (run.tags.schema, run.tags.workload, run.tags.hardware) == ("calibration", "calibration (quick)", "local: ?")
    link = tmp_path / "link.toml"
    link.symlink_to("/dev/zero")
    with pytest.raises(OpmapError, match=r"calibration profile .*link.toml is a symbolic link"):
        read_profile(link)
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:  # sparse: refused on its size, nothing read
        f.truncate(LIMIT_TOML_BYTES + 1)
    with pytest.raises(OpmapError, match=r"big.toml is 4.0 MiB, over the 4 MiB opmap reads for it"):
        read_profile(big)


@pytest.mark.parametrize("body", [
    {"assumptions": [], "nodes": [{"op": "aten.mm.default", "inputs": {"shape": 3}}]},
    {"assumptions": {"workload": "m"}, "nodes": [1, "x", {"op": 7, "outputs": [{"shape": 5}, "t"]}]},
    {"assumptions": {}, "nodes": {"a": 1}, "phase": "prefill", "parallelism": {"tp": 2}},
])
def test_tags_of_a_damaged_body_are_taken_never_raised(body):
    """A run folder's analysis.json is someone else's file: a field of the wrong type raised TypeError or
    AttributeError out of compare / memo (found by tests/test_fuzz_inputs.py's run-folder row). It is taken as
    absent; an intact body hashes as before."""
    from opmap.store.rows import analysis_tags, graph_hash

    tags = analysis_tags(body)
    assert tags.tags_version == 1 and len(tags.graph_hash) == 16
    good = [{"op": "aten.mm.default", "inputs": [{"shape": [2, 3]}], "outputs": [{"shape": [2, 4]}]}]
    import hashlib

    h = hashlib.sha256()
    h.update(b"aten.mm.default")
    h.update(b"(2, 3)")
    h.update(b"(2, 4)")
    assert graph_hash(good) == h.hexdigest()[:16]
