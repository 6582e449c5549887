"""What every benchmark script shares for benchmarks/RESULTS.md: a generated table between two markers,
"mean ± sample sd" over seeds, and an exclusive claim on a file among the processes writing results."""

from __future__ import annotations

import contextlib
import fcntl
import statistics
from pathlib import Path


def replace_between(text: str, name: str, body: str) -> str:
    """`text` with what stands between `<!-- name:begin -->` and `<!-- name:end -->` replaced by `body`
    (both markers and the body appended when the markers are absent)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin not in text:
        return f"{text}\n{begin}\n{body}\n{end}\n"
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def update_sections(md: Path, sections: dict[str, str]) -> None:
    """Each generated section of `md` (benchmarks/RESULTS.md) named in `sections` replaced by its body
    (replace_between), in one rename (recsys.atomic) under a claim on the file: two benchmark scripts that
    finish together each keep the other's tables, and an interrupted write leaves the last file whole."""
    from recsys.atomic import write_text_atomic  # (the importing script has put the repository root on sys.path)

    with claimed(md):
        text = md.read_text() if md.is_file() else "# Benchmark results\n"
        for name, body in sections.items():
            text = replace_between(text, name, body)
        write_text_atomic(md, text, md.parent)


def save_figure(fig, path: Path, dpi: int = 110) -> None:
    """`fig.savefig(path)` in one rename (recsys.atomic): a half-written picture never replaces the last one.
    The format is the path's suffix (the temporary file's name ends in .tmp)."""
    from recsys.atomic import atomic_path  # (the importing script has put the repository root on sys.path)

    with atomic_path(path, path.parent) as tmp:
        fig.savefig(tmp, dpi=dpi, format=path.suffix[1:])


def row_seed(row: dict) -> int:
    """A result row's seed (rows from before `--seeds` carry it only in the train config)."""
    return int(row["seed"] if "seed" in row else row["train"]["seed"])


def row_key(row: dict) -> tuple[str, str, int]:
    """A result row's key in a results file: (dataset, run, seed)."""
    return row["dataset"], row["run"], row_seed(row)


def mean_sd(values: list[float], digits: int = 4, one: str = "") -> str:
    """"mean ± sample sd"; a single value alone, followed by `one` (e.g. " (1 seed)" where no column says)."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}{one}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


@contextlib.contextmanager
def claimed(path: Path, wait: bool = True):
    """An exclusive claim on `path` (a lock file beside it, `path` with the suffix `.lock`) among processes;
    yields False (without waiting) when `wait` is off and another process holds it. The kernel drops the claim
    when its holder dies, so a killed process leaves no stale claim behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
