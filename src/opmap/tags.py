"""A run's telemetry tags: one frozen value, built by the command that ran (analysis, profile, calibrate, bench,
plan, sweep, serve, fit, tune, shape-check), and written as JSON where a run is recorded (the run store's tags
column, profile.json's ``tags``, a trace's ``otherData``, the HTML report's #opmap-tags).

Tags are stable and versioned: a tag's name and meaning only change with ``TAGS_VERSION``. Each command records
its own set of tags, in its own order (``KEYS``); ``to_dict`` writes exactly that set in that order, so the JSON a
run's files and its store row hold is the same from one release to the next. A leaf module: the store, measure
and bench build tags, so their schema lives below all three.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from opmap.record import record

TAGS_VERSION = 1  # the tag names below; a new tag may be added, a renamed one bumps this

# the tags each command records, in the order they are written (a None value is written as null)
KEYS: dict[str, tuple[str, ...]] = {
    "analysis": ("tags_version", "workload", "hardware", "phase", "precision", "batch", "seq", "fusion",
                 "parallelism", "graph_hash", "opmap_version", "torch_version"),
    "profile": ("tags_version", "run_id", "time_utc", "workload", "batch", "seq", "dtype", "mode", "device",
                "device_name", "hardware_profile", "host", "threads", "torch_version", "opmap_version",
                "python_version"),
    "calibration": ("tags_version", "workload", "hardware", "phase", "precision", "torch_version", "fingerprint"),
    "bench": ("workload", "hardware", "phase", "precision", "parallelism", "endpoint", "server", "model",
              "served_models", "api", "workload_spec", "client_version"),
    "plan": ("workload", "hardware", "phase", "precision", "parallelism"),
    "sweep": ("workload", "hardware", "phase", "precision"),  # also fit and tune: the same four
    "serve": ("workload", "hardware", "phase", "precision", "parallelism"),
    "serve-predicted": ("workload", "hardware", "phase", "precision", "parallelism", "predicted_from", "endpoint"),
    "shape-check": ("workload", "command"),
}
# what every recorded run carries ahead of its command's own tags (store.db.record)
RECORDED_KEYS = ("opmap_version", "git_commit", "command")


@dataclass(frozen=True)
class Fingerprint:
    """The local machine a calibration profile was measured on (calibrate's fingerprint)."""

    model: str | None = None  # the device's model name
    machine: str | None = None  # the CPU architecture (platform.machine)
    threads: int | None = None
    cores: int | None = None
    memory_bytes: int | None = None


@dataclass(frozen=True)
class Tags:
    """One run's telemetry tags. ``schema``: the command's tag set (a key of ``KEYS``); only its tags are written.
    Values come from the run's own files and are written as they were read (a damaged file's field is caught by
    store.validate before anything is recorded)."""

    schema: str
    tags_version: int = TAGS_VERSION
    workload: str | None = None  # a zoo name, a user file, a served model, or several joined by commas
    hardware: str | None = None  # a catalog name, the local fingerprint, or an endpoint's URL
    phase: str | None = None  # prefill, decode, train, serve, bench, calibrate, tune
    precision: str | None = None  # the --dtype the run asked for
    batch: int | None = None
    seq: int | None = None
    fusion: str | None = None  # the fusion policy
    parallelism: str | None = None  # "tp2 pp1 dp1 ep1", "8 devices", "closed loop c=4", ...
    graph_hash: str | None = None  # store.rows.graph_hash of the run's graph
    opmap_version: str | None = None
    torch_version: str | None = None
    # a measured run (opmap profile): measure.run.telemetry_tags
    run_id: str | None = None
    time_utc: str | None = None
    dtype: str | None = None
    mode: str | None = None  # inference, train, inference (onnxruntime)
    device: str | None = None
    device_name: str | None = None
    hardware_profile: str | None = None
    host: str | None = None
    threads: int | None = None
    python_version: str | None = None
    fingerprint: Fingerprint | None = None  # a calibration run's machine
    # a measured load (opmap bench) and a prediction of it
    endpoint: str | None = None  # the base URL
    server: str | None = None  # the server's Server header
    model: str | None = None  # the model the client asked for
    served_models: tuple[str, ...] | None = None  # /v1/models
    api: str | None = None
    workload_spec: str | None = None
    client_version: str | None = None
    predicted_from: str | None = None
    # added where a run is recorded
    recorded: bool = False  # whether RECORDED_KEYS head the tags (store.db.record)
    git_commit: str | None = None
    command: str | None = None
    imported_from: str | None = None  # opmap runs import: the file the run came from

    def __post_init__(self) -> None:
        if self.schema not in KEYS:
            raise ValueError(f"no tag set {self.schema!r}; accepted: {', '.join(KEYS)}")

    def keys(self) -> tuple[str, ...]:
        """The tag names written, in order."""
        own = KEYS[self.schema]
        keys = (*RECORDED_KEYS, *(k for k in own if k not in RECORDED_KEYS)) if self.recorded else own
        return (*keys, "imported_from") if self.imported_from is not None else keys

    def has(self, key: str) -> bool:
        return key in self.keys()

    def get(self, key: str) -> Any:
        """A tag's value as written (None where this run's tag set has no such tag)."""
        return self.to_dict().get(key)

    def to_dict(self) -> dict[str, Any]:
        """The tags as JSON writes them (the store's tags column, profile.json, traces, the HTML report). A computed
        shape: the keys written are the command's tag set (``keys``), not the fields."""
        out: dict[str, Any] = {}
        for k in self.keys():
            v = getattr(self, k)
            out[k] = record(v) if isinstance(v, Fingerprint) else list(v) if isinstance(v, tuple) else v
        return out

    def as_recorded(self, version: str, git_commit: str | None, command: str | None) -> Tags:
        """The tags a recorded run carries: opmap's version (the run's own where its tag set holds one), the git
        commit and the command line (the run's own where it names one: a shape check names the compare it
        ran under) ahead of the command's tags."""
        return replace(self, recorded=True, git_commit=git_commit,
                       opmap_version=self.opmap_version if "opmap_version" in KEYS[self.schema] else version,
                       command=self.command if self.command is not None else command)
