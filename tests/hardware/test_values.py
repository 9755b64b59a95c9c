"""A catalog value's JSON record (opmap.hardware.values.Value through opmap.record): value, kind and source, its
note only where it has one (the runtime block of analysis.json and serve.json writes it so)."""

from opmap.hardware.values import Value
from opmap.record import record


def test_a_value_records_its_note_only_where_set():
    v = Value(4.5e-6, "measured", "CUDA graph replay, H100 (example)")
    assert record(v) == {"value": 4.5e-6, "kind": "measured", "source": "CUDA graph replay, H100 (example)"}
    n = Value(None, "datasheet", "vendor", note="not published")
    assert list(record(n)) == ["value", "kind", "source", "note"] and record(n)["note"] == "not published"
    assert Value(**record(n)) == n  # opmap.phases.runtime.Runtime.from_dict reads it back so
