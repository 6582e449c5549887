"""Interaction sources → the canonical table (recsys/schema.py).

Readers for MovieLens-1M (`::`), MovieLens-100K (tab) and generic CSV/Parquet with a column mapping; a
checksum-verified downloader for the official MovieLens archives; and a deterministic generator with planted
sequential and time-of-day / day-of-week structure, which is the embedded default dataset.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import shutil
import tempfile
import urllib.parse
import urllib.request
import zipfile
import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from recsys import schema
from recsys.atomic import write_text_atomic
from recsys.config import GenerateConfig, IngestConfig
from recsys.ingest import IngestError
from recsys.ingest.canonical import CANONICAL, to_canonical
from recsys.ingest.read import nested_value, read_file
from recsys.store import TMP_PREFIX, to_arrow
from recsys.validation import PARSE_ERROR

log = logging.getLogger(__name__)


class DataError(ValueError):
    """An input file is missing, malformed or fails its checksum; the message says which and why."""


def canonical(frame: pd.DataFrame) -> pd.DataFrame:
    """Coerce a frame with the canonical column names to the canonical dtypes and values.

    The conversion is `recsys.ingest.canonical.to_canonical`, the one used for ingested batches, so a
    dataset imported here and the same rows ingested later agree ("7" for an id stored as 7.0, a null event
    for a missing one). A value that cannot be converted is an error here (ingest quarantines the row).
    """
    missing = [c for c in schema.REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise DataError(f"missing required column(s) {missing}; got {list(frame.columns)}")
    full = frame.copy(deep=False)
    if schema.RATING not in full:
        full[schema.RATING] = np.nan
    if schema.EVENT not in full:
        full[schema.EVENT] = pd.Series(pd.NA, index=full.index, dtype="string")
    typed = to_canonical(full)
    parse_error = typed[PARSE_ERROR]
    missing_value = typed[list(schema.REQUIRED_COLUMNS)].isna()
    bad = parse_error.notna().to_numpy() | missing_value.any(axis=1).to_numpy()
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        why = parse_error.iloc[first]
        if pd.isna(why):
            why = f"{missing_value.columns[missing_value.iloc[first].to_numpy()][0]} is missing"
        raise DataError(
            f"{int(bad.sum())} of {len(frame)} rows have an unusable value, e.g. row {first + 1}: {why}"
        )
    # Through Arrow, so the frame has exactly the dtypes the store reads back (`recsys.store.read_store`).
    return to_arrow(typed[list(CANONICAL)].astype({schema.TIMESTAMP: "int64"})).to_pandas()


def check_seed(frame: pd.DataFrame, config: IngestConfig, now: int | None = None) -> tuple[pd.DataFrame, int]:
    """A seed import (`canonical` rows) under the row checks every ingested batch gets (params.yaml `ingest`):
    a row failing one refuses the import — a seed is not quarantined, and a bad seed row would otherwise be
    stored while the same row in a batch is not — and so do fewer than `ingest.min_rows` rows. Duplicate
    (user, item, timestamp) events are kept once, by ingest's rule. Returns the rows to store and how many
    duplicates were dropped."""
    import time

    from recsys import validation
    from recsys.ingest.plan import dedup_within
    from recsys.ingest.report import group_reasons

    if len(frame) < config.min_rows:
        raise DataError(f"{len(frame)} data rows: a seed needs at least ingest.min_rows = {config.min_rows}")
    now = int(time.time()) if now is None else now
    parameters = validation.suite_parameters(config, now, has_history=False)
    checked = frame.assign(**{PARSE_ERROR: pd.Series(pd.NA, index=frame.index, dtype="string")})
    reasons = validation.row_failures(checked, parameters)
    bad = (reasons != "").to_numpy()
    if bad.any():
        top = "; ".join(f"{n} × {why}" for why, n in list(group_reasons(reasons[bad]).items())[:3])
        first = int(np.flatnonzero(bad)[0])
        raise DataError(
            f"{int(bad.sum())} of {len(frame)} rows fail the checks every ingested batch gets: {top} (first: "
            f"row {first + 1}, {frame.iloc[first].to_dict()}); correct them, or the params.yaml setting the "
            f"reason names (ingest.timestamp_floor = {config.timestamp_floor}, "
            f"ingest.max_future_skew_seconds = {config.max_future_skew_seconds}, ingest.allowed_events)"
        )
    duplicate = dedup_within(frame)
    return frame.loc[~duplicate].reset_index(drop=True), int(duplicate.sum())


# The ratings file of each MovieLens layout, and its `data import` source name.
RATINGS_FILES = {"ratings.dat": "movielens-1m", "u.data": "movielens-100k"}


def _ratings_file(path: Path, name: str) -> Path:
    path = Path(path)
    candidate = path / name if path.is_dir() else path
    if not candidate.is_file():
        other = next((f for f in RATINGS_FILES if f != name and path.is_dir() and (path / f).is_file()), None)
        hint = f" ({path} holds {other}: import it as {RATINGS_FILES[other]})" if other else ""
        raise DataError(f"{candidate} not found{hint}")
    return candidate


def read_movielens_1m(path: str | Path) -> pd.DataFrame:
    """`ratings.dat` (`user::item::rating::unix_ts`) or its folder; also accepts ml-1m-half."""
    ratings = _ratings_file(Path(path), "ratings.dat")
    try:
        frame = pd.read_csv(
            ratings, sep="::", engine="python", header=None, names=["u", "i", "r", "t"], dtype=str
        )
        return canonical(
            pd.DataFrame({schema.USER: frame.u, schema.ITEM: frame.i, schema.TIMESTAMP: frame.t.astype("int64"),
                          schema.RATING: frame.r.astype("float32"), schema.EVENT: "rating"})
        )
    except (ValueError, pd.errors.ParserError) as err:
        raise DataError(f"{ratings}: not a MovieLens-1M ratings file ({err})") from err


def read_movielens_100k(path: str | Path) -> pd.DataFrame:
    """`u.data` (`user \\t item \\t rating \\t unix_ts`) or its folder."""
    ratings = _ratings_file(Path(path), "u.data")
    try:
        frame = pd.read_csv(ratings, sep="\t", header=None, names=["u", "i", "r", "t"], dtype=str)
        return canonical(
            pd.DataFrame({schema.USER: frame.u, schema.ITEM: frame.i, schema.TIMESTAMP: frame.t.astype("int64"),
                          schema.RATING: frame.r.astype("float32"), schema.EVENT: "rating"})
        )
    except (ValueError, pd.errors.ParserError) as err:
        raise DataError(f"{ratings}: not a MovieLens-100K u.data file ({err})") from err


def read_movielens_titles(path: str | Path) -> pd.DataFrame | None:
    """Item titles (item_id, title) from `movies.dat` (ML-1M) or `u.item` (ML-100K), if present."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    if (folder / "movies.dat").is_file():
        rows = [line.split("::")[:2] for line in (folder / "movies.dat").read_text("latin-1").splitlines() if line]
    elif (folder / "u.item").is_file():
        rows = [line.split("|")[:2] for line in (folder / "u.item").read_text("latin-1").splitlines() if line]
    else:
        return None
    return pd.DataFrame(rows, columns=["item_id", "title"])


MAP_HINT = "name them with --column CANONICAL=COLUMN (or set ingest.column_mapping in params.yaml)"


def read_table(path: str | Path, mapping: dict[str, str] | None = None,
               extra_columns: str = "reject") -> pd.DataFrame:
    """Generic CSV, Parquet or JSON lines (the readers ingest uses); `mapping` maps canonical column names
    to the source's column names. A column that maps to no canonical one is refused, as a batch's is,
    unless `extra_columns` is "drop" (`ingest.extra_columns`): dropped without a word, an event column left
    unmapped would lose every event type."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path} is a folder: name one file (CSV, JSON lines or Parquet); import the "
                        "largest and ingest the others as batches")
    if not path.is_file():
        raise DataError(f"{path} not found")
    try:
        frame = read_file(path)
    except (IngestError, OSError) as err:
        raise DataError(f"{path}: cannot be read ({err})") from err
    if mapping:
        misfit = schema.mapping_misfit(list(frame.columns), mapping)
        if misfit:
            raise DataError(f"{path}: {misfit}")
        frame = frame.rename(columns={src: dst for dst, src in mapping.items()})
    missing = [c for c in schema.REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise DataError(f"{path}: missing required column(s) {missing}; the file has {list(frame.columns)}: "
                        f"{MAP_HINT}")
    extra = [c for c in frame.columns if c not in schema.CANONICAL_COLUMNS]
    if extra and extra_columns != "drop":
        raise DataError(f"{path}: column(s) {extra} map to none of {', '.join(schema.CANONICAL_COLUMNS)}: "
                        f"{MAP_HINT}, or set ingest.extra_columns: drop to leave them out")
    frame = frame[[c for c in frame.columns if c in schema.CANONICAL_COLUMNS]]
    nested = nested_value(frame)  # as a batch's: a JSON object would become the id "{'a': 1}"
    if nested:
        raise DataError(f"{path}: {nested}")
    try:
        return canonical(frame)
    except DataError as err:
        raise DataError(f"{path}: {err}") from err


URL_SCHEMES = ("http", "https", "file")  # what `download_movielens` fetches from


def url_problem(url: str) -> str | None:
    """Why `download` could not fetch `url` whatever the network says (None: it may try): not a URL urllib
    parses (`http://[::1`), another scheme, or an http(s) URL without a host."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (a port out of range or not a number raises here)
    except ValueError as err:
        return f"{url!r} is not a URL ({err})"
    if parts.scheme not in URL_SCHEMES:
        return f"{url!r} is not an http(s):// or file:// URL"
    if parts.scheme != "file" and not parts.hostname:
        return f"{url!r} names no host"
    return None


# Official archives. GroupLens publishes MD5 sums beside them (`<url>.md5`); sha256 is checked when given.
MOVIELENS = {
    "movielens-1m": ("https://files.grouplens.org/datasets/movielens/ml-1m.zip", "c4d9eecfca2ab87c1945afe126590906"),
    "movielens-100k": ("https://files.grouplens.org/datasets/movielens/ml-100k.zip", "0e33842e24a9c977be4e0107933c0723"),
}


def download(url: str, dest: str | Path, *, sha256: str | None = None, md5: str | None = None) -> Path:
    """Download a zip archive, verify its checksum(s), and extract it into the folder `dest`, which may hold
    other things: only the archive's own top-level entries there (`ml-1m/`) are replaced, each by a rename
    once the whole archive is verified and extracted (a failure leaves the old copy as it was). It used to
    replace `dest` itself: `--dest .` or a shared data folder deleted everything in it."""
    if sha256 is None and md5 is None:
        raise DataError("refusing to download without a checksum to verify")
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise DataError(f"{dest} is a file: name a folder to extract into")
    if problem := url_problem(url):
        raise DataError(problem)
    # The download and extraction happen beside their target (the same file system: renames), and a
    # failure creates no folder.
    near = next(folder for folder in (dest, *dest.absolute().parents) if folder.is_dir())
    with tempfile.TemporaryDirectory(dir=near, prefix=".download-") as tmp:
        archive = Path(tmp) / "archive.zip"
        try:
            with urllib.request.urlopen(url, timeout=120) as response, archive.open("wb") as out:
                shutil.copyfileobj(response, out)
        except (OSError, ValueError) as err:  # unreachable, missing, or a URL urllib cannot open
            raise DataError(f"download of {url} failed: {err}") from err
        payload = archive.read_bytes()
        for algo, expected in (("sha256", sha256), ("md5", md5)):
            if expected and hashlib.new(algo, payload).hexdigest() != expected.lower():
                # The official MD5 fits the official archive only: a mirror's or a repacked one needs its own;
                # the official URL's archive failing it was damaged on the way.
                official = url in {u for u, _ in MOVIELENS.values()}
                other = ("" if sha256 else " (damaged on the way: run it again)" if official else
                         " (another archive than the official one: pass its --sha256 HEX)")
                raise DataError(f"{url}: {algo} mismatch (expected {expected}); file discarded{other}")
        staging = Path(tmp) / "extracted"
        try:
            with zipfile.ZipFile(io.BytesIO(payload)) as zf:
                for member in zf.namelist():
                    if member.startswith("/") or ".." in Path(member).parts:
                        raise DataError(f"{url}: archive member {member!r} escapes the target folder")
                zf.extractall(staging)
        except zipfile.BadZipFile as err:
            raise DataError(f"{url}: not a zip archive ({err})") from err
        dest.mkdir(parents=True, exist_ok=True)
        replaced = Path(tmp) / "replaced"
        replaced.mkdir()
        undone = Path(tmp) / "undone"  # new entries taken back out (renames: an undo that cannot be slow)
        undone.mkdir()
        moved: list[tuple[Path, Path]] = []  # (a target, where its old copy goes in `replaced`), noted first
        try:
            for entry in sorted(staging.iterdir()):
                target = dest / entry.name
                moved.append((target, replaced / entry.name))  # before the rename an interrupt may follow
                if os.path.lexists(target):  # (a link too, dangling or not)
                    target.rename(replaced / entry.name)  # removed with the temporary folder
                entry.rename(target)
        except BaseException:  # (an interrupt too) every entry as it was: no archive half in place
            for target, old in reversed(moved):
                if os.path.lexists(old):
                    if os.path.lexists(target):
                        target.rename(undone / target.name)
                    old.rename(target)
                elif os.path.lexists(target) and not (staging / target.name).exists():
                    target.rename(undone / target.name)  # new, with no old copy: out again
            raise
    return dest


def download_movielens(name: str, dest: str | Path, *, url: str | None = None, sha256: str | None = None) -> Path:
    if name not in MOVIELENS:
        raise DataError(f"unknown dataset {name!r}; choose one of {sorted(MOVIELENS)}")
    official_url, md5 = MOVIELENS[name]
    # A mirror (or a file:// copy) must match the official MD5 unless the caller pins a sha256 of their own.
    return download(url or official_url, dest, sha256=sha256, md5=None if sha256 else md5)


@dataclass(frozen=True)
class Generated:
    interactions: pd.DataFrame
    items: pd.DataFrame  # item_id, title


def generate(config: GenerateConfig) -> Generated:
    """Synthetic interactions with structure a sequential model can find and MostPop cannot.

    Items fall into `n_clusters` genres, each an ordered chain. A user has a home genre and mostly walks
    forward along its chain (next item = the one after the current), sometimes jumps to another genre.
    Event times are spaced by hours to days; evening and weekend events favour the odd-numbered genres, so
    time features carry signal (what MOJITO exploits). Everything derives from `config.seed`.
    """
    rng = np.random.default_rng(config.seed)
    n_items, n_clusters = config.n_items, config.n_clusters
    cluster_of = np.arange(n_items) % n_clusters
    chains = [np.flatnonzero(cluster_of == c) for c in range(n_clusters)]
    rank_in_chain = np.empty(n_items, dtype=np.int64)
    for chain in chains:
        rank_in_chain[chain] = np.arange(len(chain))
    t0 = int(_utc(config.start).timestamp())
    horizon = config.days * 86400

    users, items, times = [], [], []
    for u in range(config.n_users):
        n = max(5, int(rng.poisson(config.mean_events_per_user)))
        home = rng.integers(n_clusters)
        t = t0 + int(rng.integers(0, horizon // 4))
        current = chains[home][rng.integers(len(chains[home]))]
        for _ in range(n):
            hour = (t // 3600) % 24
            weekday = ((t // 86400) + 3) % 7  # 1970-01-01 was a Thursday (weekday 3, Monday = 0)
            leisure = hour >= 18 or weekday >= 5
            if rng.random() < 0.8:
                chain = chains[cluster_of[current]]
                current = chain[(rank_in_chain[current] + 1 + (rng.random() < 0.2)) % len(chain)]
            else:
                odd = [c for c in range(n_clusters) if (c % 2 == 1) == leisure] or list(range(n_clusters))
                cluster = home if rng.random() < 0.5 else odd[rng.integers(len(odd))]
                current = chains[cluster][rng.integers(len(chains[cluster]))]
            users.append(u + 1)
            items.append(int(current) + 1)
            times.append(t)
            t += int(rng.exponential(3 * 3600)) + 60
    interactions = canonical(
        pd.DataFrame({schema.USER: [f"u{u}" for u in users], schema.ITEM: [f"i{i}" for i in items],
                      schema.TIMESTAMP: times, schema.EVENT: "view"})
    )
    titles = pd.DataFrame({"item_id": [f"i{i + 1}" for i in range(n_items)],
                           "title": [f"Item {i + 1} (genre {cluster_of[i]})" for i in range(n_items)]})
    return Generated(interactions, titles)


SEED_PART = "part-0000000000000000.parquet"


def write_table(frame: pd.DataFrame, path: Path) -> None:
    """Canonical Parquet with fixed writer options, so the same rows always give the same bytes."""
    table = pa.Table.from_pandas(canonical(frame), schema=schema.ARROW_SCHEMA, preserve_index=False)
    table = table.replace_schema_metadata(None)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Named as the store's temps are (a dot: never a part), so a kill here leaves nothing the next ingest
    # versions: it removes `.tmp-*` leftovers under its lock (recsys.store.remove_stale_temp_files).
    tmp = path.parent / f"{TMP_PREFIX}{os.getpid()}-{path.name}"
    try:
        pq.write_table(table, tmp, compression="zstd", use_dictionary=True, write_statistics=False)
        tmp.replace(path)
    except BaseException:  # a full disk, an interrupt: no half-written part left beside the store's
        tmp.unlink(missing_ok=True)
        raise


def check_no_batches(store: str | Path) -> None:
    """A new seed only goes into a store that holds no ingested batches: under them it would change the
    history they were deduplicated and validated against (and mix two datasets)."""
    interactions = Path(store) / "interactions"
    batches = sorted(p.name for p in interactions.glob("part-*.parquet") if p.name != SEED_PART)
    if batches:
        raise DataError(f"{store} already holds {len(batches)} ingested batch(es) ({', '.join(batches[:3])}"
                        f"{'…' if len(batches) > 3 else ''}); a new seed under them would mix two datasets. "
                        "Write it into an empty folder with --out (a new dataset wants a repository of its "
                        "own: this one's ingest history would count its batches as ingested); ingested batches "
                        "are never deleted by hand (README, Guarantees).")


def write_store(generated: Generated, store: str | Path) -> Path:
    """Write a dataset as the seed part of a raw store (`<store>/interactions/`) plus `items.csv`; refused
    (`check_no_batches`) when the store holds ingested batches."""
    store = Path(store)
    check_no_batches(store)
    part = store / "interactions" / SEED_PART
    write_table(generated.interactions, part)
    write_text_atomic(store / "items.csv", generated.items.to_csv(index=False, lineterminator="\n"), store)
    return part


BATCH_HORIZON = pd.Timestamp("2200-01-01", tz="UTC")  # no generated batch reaches past this


def _utc(stamp: str) -> pd.Timestamp:
    """generate.start in UTC, read by the parser GenerateConfig checks it with: pandas' own takes other forms
    and refuses some of Python's ("2024-W01-1" passed the check, then was a DateParseError traceback here)."""
    moment = datetime.fromisoformat(stamp)
    return pd.Timestamp(moment if moment.tzinfo else moment.replace(tzinfo=UTC)).tz_convert("UTC")


def batch_index_problem(config: GenerateConfig, index: int, said: str | None = None) -> str | None:
    """Why `index` names no batch of the generated dataset (None when it does): batch i ends (i + 1)·days
    after generate.start, and past the year 2200 its timestamps would leave pandas' range. `said`: how the
    message names the index (a command line's number too long to show)."""
    last = max(0, (BATCH_HORIZON - _utc(config.start)).days // config.days - 1)
    if 1 <= index <= last:
        return None
    return (f"batch index must be between 1 and {last:,} (each batch covers the generate.days = "
            f"{config.days} days after the previous one, from generate.start {config.start}), got "
            f"{said or f'{index:,}'}")


def generate_batch(config: GenerateConfig, index: int) -> pd.DataFrame:
    """A follow-up batch for the generated dataset: the same users and items, later in time.

    Batch `index` (1, 2, …) covers the `config.days` after the previous one, for a fifth of the users, so a
    demo (or a test) can drop realistic new interactions into the inbox.
    """
    problem = batch_index_problem(config, index)
    if problem:
        raise DataError(problem)
    start = _utc(config.start)
    later = dataclasses.replace(
        config,
        seed=(config.seed + 1000 * index) % 2**32,  # (within generate.seed's range, whatever the index)
        n_users=max(1, config.n_users // 5),
        mean_events_per_user=max(5, config.mean_events_per_user // 4),
        start=(start + pd.Timedelta(days=config.days * index)).isoformat(),
    )
    return generate(later).interactions
