"""Ingest interaction batches into the DVC-versioned raw store, exactly once.

One batch = one file (CSV, Parquet or JSON lines) in the inbox. Its identity is the sha256 of its bytes.
For each batch, under an exclusive lock on the repository:

1. read it (column mapping applied), validate the schema (GX suite `interactions_schema`) — reject on
   failure (`read`, `plan`);
2. convert to the canonical types (`canonical`), validate the whole batch (GX `interactions_batch`: row
   count, per-row rules with a tolerance, unseen users/items) — reject on failure or when the bad-row share
   exceeds `ingest.max_bad_row_share`;
3. send failing rows to `quarantine/` (with a reason per row), drop duplicate events (within the batch and
   against the store), validate the rows to append strictly (GX `interactions_store`);
4. commit: push marker → journal → part file (atomic) → `dvc add data` → manifest line → key index →
   remove journal (`commit`); after the last batch, `dvc push` and remove the push marker (`recovery`).

Deduplication and the unseen-user/item checks use a key index (`keys`), so a batch costs O(batch), not
O(store). A rejected batch changes nothing in the store, the manifest or `data.dvc`; it only leaves a
report. A crash anywhere in step 4 is completed (or rolled back, if the part never appeared) by the next run
or by any reader (`recover`), and a push left undone is finished by the next run, whatever it ingests.

The package loads each part on first use (PEP 562 `__getattr__`): `recsys.ingest.layout.has_work`, the
stat-only check a scheduled run makes before ingesting, must not pay for pandas, pyarrow and Great
Expectations when the inbox is empty. The `TYPE_CHECKING` imports name every part for type checkers and for
`recsys.dvc_graph`, which reads import statements: a stage that imports the package still depends on all of it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recsys.faults import FAULT_ENV
    from recsys.ingest.canonical import CANONICAL, KEY, to_canonical
    from recsys.ingest.commit import FAULT_POINTS
    from recsys.ingest.errors import BatchRejected, IngestError
    from recsys.ingest.layout import file_sha256
    from recsys.ingest.plan import dedup_within
    from recsys.ingest.read import READERS, read_batch
    from recsys.ingest.recovery import complete_push, recover
    from recsys.ingest.report import IngestSummary, Status
    from recsys.ingest.run import IngestRun, PushFailed, ingest_batches, ingest_inbox

_PARTS = {  # module → the names the package re-exports from it (the same as the imports above)
    "recsys.faults": ("FAULT_ENV",),
    "recsys.ingest.canonical": ("CANONICAL", "KEY", "to_canonical"),
    "recsys.ingest.commit": ("FAULT_POINTS",),
    "recsys.ingest.errors": ("BatchRejected", "IngestError"),
    "recsys.ingest.layout": ("file_sha256",),
    "recsys.ingest.plan": ("dedup_within",),
    "recsys.ingest.read": ("READERS", "read_batch"),
    "recsys.ingest.recovery": ("complete_push", "recover"),
    "recsys.ingest.report": ("IngestSummary", "Status"),
    "recsys.ingest.run": ("IngestRun", "PushFailed", "ingest_batches", "ingest_inbox"),
}
_HOMES = {name: module for module, names in _PARTS.items() for name in names}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup is an ordinary attribute
    return value
