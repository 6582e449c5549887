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
"""

from recsys.ingest.canonical import CANONICAL, KEY, to_canonical
from recsys.ingest.commit import FAULT_POINTS
from recsys.ingest.errors import BatchRejected, IngestError
from recsys.ingest.layout import file_sha256
from recsys.ingest.plan import dedup_within
from recsys.ingest.read import READERS, read_batch
from recsys.ingest.recovery import complete_push, recover
from recsys.ingest.report import IngestSummary, Status
from recsys.ingest.run import IngestRun, PushFailed, ingest_batches, ingest_inbox
from recsys.faults import FAULT_ENV

__all__ = [
    "BatchRejected", "CANONICAL", "FAULT_ENV", "FAULT_POINTS", "IngestError", "IngestRun", "IngestSummary",
    "KEY", "PushFailed", "READERS", "Status", "complete_push", "dedup_within", "file_sha256",
    "ingest_batches", "ingest_inbox", "read_batch", "recover", "to_canonical",
]
