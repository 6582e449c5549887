"""What every benchmark script shares for benchmarks/RESULTS.md: a generated table between two markers, and
"mean ± sample sd" over seeds."""

from __future__ import annotations

import statistics


def replace_between(text: str, name: str, body: str) -> str:
    """`text` with what stands between `<!-- name:begin -->` and `<!-- name:end -->` replaced by `body`
    (both markers and the body appended when the markers are absent)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin not in text:
        return f"{text}\n{begin}\n{body}\n{end}\n"
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def mean_sd(values: list[float], digits: int = 4, one: str = "") -> str:
    """"mean ± sample sd"; a single value alone, followed by `one` (e.g. " (1 seed)" where no column says)."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}{one}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"
