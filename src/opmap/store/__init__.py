"""The run store: every run recorded in one embedded DuckDB file, with stable, versioned telemetry tags.

Where: ``--store PATH``, else ``$OPMAP_STORE``, else ``${XDG_DATA_HOME:-~/.local/share}/opmap/runs.duckdb``;
``--no-store`` (or ``OPMAP_STORE=off``) records nothing.

Concurrency (DuckDB allows one read-write process at a time): a run is first written whole as its own spool
file beside the store (``runs.duckdb.spool/ID.json``, a temporary name then ``os.replace``: it exists complete
or not at all), then every spool file present is ingested under an exclusive ``fcntl.flock`` on
``runs.duckdb.lock`` (retried until a timeout), one transaction per run, and deleted once committed. Several
processes finishing at once all land: each waits its turn for the lock, and whichever holds it ingests every
spool file it finds, its own and the others'. A writer killed before its ``os.replace`` leaves nothing; killed
after it, its run waits in the spool for the next writer; killed inside an ingest, DuckDB rolls the open
transaction back and the spool file is still there. A spool file whose run id is already in the store (killed
between the commit and the delete) is dropped, not ingested twice.

Schema (``meta.schema_version`` 1): ``runs`` (id, kind, time_utc, the main tags as columns, all tags as JSON,
the payload as JSON), ``kernels`` (run_id, idx, name, layer_type, predicted_s, measured_s, flops, bytes, bound),
``layer_types`` (run_id, layer_type, predicted_s, measured_s, share), ``samples`` (run_id, metric, i, value_s).
``duckdb`` is an optional extra (``opmap[store]``, in ``dev``); without it nothing is recorded and the ``runs``
commands say how to install it.
"""

from opmap.store.db import SCHEMA_VERSION, StoreUnavailable, default_path, list_runs, record, show_run

__all__ = ["SCHEMA_VERSION", "StoreUnavailable", "default_path", "list_runs", "record", "show_run"]
