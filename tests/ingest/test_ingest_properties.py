"""Hypothesis properties: ingesting a batch twice equals ingesting it once; dedup ignores row order."""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recsys import ingest
from recsys.store import read_store
from test_ingest_support import T0, config, make_repo, write_frame

CFG = config(max_bad_row_share=1.0)
_counter = itertools.count()

rows = st.lists(
    st.tuples(
        st.sampled_from(["u1", "u2", "u3", None]),
        st.sampled_from(["i1", "i2", "i3"]),
        st.integers(min_value=0, max_value=3).map(lambda d: T0 + d),
        st.sampled_from([None, 1.0, 5.0]),
        st.sampled_from(["view", "click", None]),
    ),
    min_size=1,
    max_size=25,
)


def frame_of(data):
    return pd.DataFrame(data, columns=["user_id", "item_id", "timestamp", "rating", "event"])


def canonical_set(frame):
    """Rows as a sorted list (order-free comparison; NaN made comparable)."""
    return sorted(tuple("<NA>" if pd.isna(v) else v for v in row) for row in frame.itertuples(index=False))


@settings(max_examples=200, deadline=None)
@given(rows, st.randoms(use_true_random=False))
@pytest.mark.slow  # over 2 s on an idle 2-core box (a process start): with the slow tests
def test_dedup_within_does_not_depend_on_row_order(data, rnd):
    frame = frame_of(data).dropna(subset=["user_id"]).reset_index(drop=True)
    frame["rating"] = frame["rating"].astype("float32")
    shuffled = frame.sample(frac=1.0, random_state=rnd.randint(0, 2**31)).reset_index(drop=True)
    kept = frame[~ingest.dedup_within(frame)]
    kept_shuffled = shuffled[~ingest.dedup_within(shuffled)]
    assert canonical_set(kept) == canonical_set(kept_shuffled)
    assert not kept.duplicated(ingest.KEY).any()
    assert set(map(tuple, kept[ingest.KEY].values.tolist())) == set(
        map(tuple, frame[ingest.KEY].values.tolist())
    )


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows, rows, st.integers(min_value=0, max_value=2**31))
def test_ingesting_twice_equals_ingesting_once_and_order_does_not_matter(history, batch, seed):
    base = Path(tempfile.mkdtemp(prefix="prop-"))
    try:
        results = []
        template = make_repo(base / "template")
        ingest.ingest_batches([write_frame(template / "inbox" / "h.csv", frame_of(history))], template, CFG)
        for variant in ("once", "twice", "shuffled"):
            repo = shutil.copytree(template, base / variant)
            frame = frame_of(batch)
            if variant == "shuffled":
                frame = frame.sample(frac=1.0, random_state=np.random.RandomState(seed)).reset_index(
                    drop=True
                )
            path = write_frame(repo / "inbox" / "b.csv", frame)
            first = ingest.ingest_batches([path], repo, CFG)[0]
            if variant == "twice":
                again = ingest.ingest_batches([path], repo, CFG)[0]
                assert again.status == "duplicate_batch"
            results.append(
                (
                    first.status,
                    first.rows_accepted,
                    first.rows_duplicate,
                    first.rows_quarantined,
                    canonical_set(read_store(repo / "data")),
                )
            )
        assert results[0] == results[1]  # twice == once
        assert results[0] == results[2]  # row order of the batch does not change what lands
    finally:
        shutil.rmtree(base, ignore_errors=True)
