"""The run store: every run recorded in one embedded DuckDB file, with stable, versioned telemetry tags.

Where: ``--store PATH``, else ``$OPMAP_STORE``, else ``${XDG_DATA_HOME:-~/.local/share}/opmap/runs.duckdb``;
``--no-store`` (or ``OPMAP_STORE=off``) records nothing.

Concurrency (DuckDB allows one read-write process, or many read-only ones, at a time): a run is first written
whole as its own spool file beside the store (``runs.duckdb.spool/ID.json``, a temporary name, fsync, then
``os.replace``: it exists complete or not at all). Whoever opens DuckDB read-write (an ingest, a migration, a
rebuild, an import) holds ``runs.duckdb.lock`` exclusive; every read-only connection holds it shared for as long
as it is open, so the two never meet (opmap.store.locks; a gate lets a waiting writer in before new readers). A
reader with no spool file waiting opens read-only at once; otherwise it first ingests every spool file present
under the exclusive lock, one transaction per run, each moved into the journal (``.spool/done/``) once
committed. A writer killed before its ``os.replace`` leaves nothing; killed after it, its run waits in the spool
for the next reader or writer; killed inside an ingest, DuckDB rolls the open transaction back and the spool file
is still there. A spool file whose run id is already in the store (killed between the commit and the move) is
journalled, not ingested twice.

Never poisoned: every run is checked (opmap.store.validate) before it is spooled, and again as it is ingested;
a spool file that fails (written by hand, or by an older opmap) is moved to ``.spool/quarantine/`` with one line
on stderr, and the reads go on. A new store is built under a temporary name and renamed into place, so a full
disk leaves no store rather than a 0-byte one. A store file DuckDB cannot read (0 bytes, foreign, truncated,
bit-flipped: any DuckDB error of the open or of a later query that is not the host's, such as a lock another
program holds or a full disk) is moved aside (kept, never deleted) and rebuilt from the journal where the journal
holds every run (the store was created by this opmap, which marks ``.spool/done/.complete``; a 0-byte file held
none), with one line saying so, and the read goes on (opmap.store.reading); otherwise opmap stops with one line
saying what to do. Delete the store and its ``.spool`` folder together to start over: a store file alone is
rebuilt from the journal. ``runs import`` is all or nothing (opmap.store.transfer). Nothing is written through a
symlink.

Schema (``meta.schema_version`` 1): ``runs`` (id, kind, time_utc, the main tags as columns, all tags as JSON,
the payload as JSON), ``kernels`` (run_id, idx, name, layer_type, predicted_s, measured_s, flops, bytes, bound),
``layer_types`` (run_id, layer_type, predicted_s, measured_s, share), ``samples`` (run_id, metric, i, value_s).
``duckdb`` is an optional extra (``opmap[store]``, in ``dev``); without it nothing is recorded and the ``runs``
commands say how to install it.
"""

from opmap.store.db import SCHEMA_VERSION, StoreUnavailable, default_path, record
from opmap.store.reading import list_runs, show_run
from opmap.store.validate import validate_run

__all__ = ["SCHEMA_VERSION", "StoreUnavailable", "default_path", "list_runs", "record", "show_run", "validate_run"]
