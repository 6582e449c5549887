import datetime as dt
import random

import pytest
import torch

from recsys.models.time_features import FEATURE_NAMES, time_features

UTC = dt.UTC


def expected(ts: int, base_year: int) -> list[int]:
    d = dt.datetime.fromtimestamp(ts, UTC)
    iso = d.isocalendar()
    return [d.year - base_year + 1, d.month, d.day, iso.weekday, d.timetuple().tm_yday, iso.week, d.hour]


def stamp(*args: int) -> int:
    return int(dt.datetime(*args, tzinfo=UTC).timestamp())


def test_random_timestamps_match_datetime():
    rng = random.Random(0)
    # 1901..2099 plus the MovieLens era densely; negative seconds exercise floor division.
    ts = [rng.randint(stamp(1901, 1, 1), stamp(2099, 12, 31, 23, 59, 59)) for _ in range(20_000)]
    ts += [rng.randint(stamp(1997, 1, 1), stamp(2004, 1, 1)) for _ in range(5_000)]
    got = time_features(torch.tensor(ts), base_year=2000).tolist()
    assert got == [expected(t, 2000) for t in ts]


EDGES = [
    (1970, 1, 1, 0, 0, 0),
    (1969, 12, 31, 23, 59, 59),
    (1900, 2, 28, 12),  # 1900 is not a leap year
    (1900, 3, 1),
    (2000, 2, 29, 23, 59, 59),  # 2000 is
    (2000, 3, 1),
    (2000, 12, 31, 23, 59, 59),  # day 366
    (2004, 12, 31),  # ISO week 53 of 2004
    (2005, 1, 1),  # still ISO week 53 of 2004
    (2005, 1, 3),  # ISO week 1 of 2005
    (2008, 12, 29),  # ISO week 1 of 2009
    (2010, 1, 3),  # ISO week 53 of 2009
    (2015, 12, 31),  # week 53 (2015 starts on a Thursday)
    (2020, 12, 31),  # week 53 (leap year starting on a Wednesday)
    (2021, 1, 3),  # ISO week 53 of 2020
    (2024, 12, 30),  # ISO week 1 of 2025
    (2100, 2, 28, 23),
    (2100, 3, 1),  # 2100 is not a leap year
]


@pytest.mark.parametrize("args", EDGES, ids=lambda a: "-".join(map(str, a)))
def test_edge_cases(args):
    ts = stamp(*args)
    for shift in (-1, 0, 1, 3599, 86_399):
        assert time_features(torch.tensor([ts + shift]), base_year=1995)[0].tolist() == expected(
            ts + shift, 1995
        )


def test_every_day_of_leap_and_boundary_years():
    days = [
        stamp(y, 1, 1) + k * 86_400 + 13 * 3600 for y in (1999, 2000, 2003, 2004, 2009) for k in range(366)
    ]
    got = time_features(torch.tensor(days), base_year=1999).tolist()
    assert got == [expected(t, 1999) for t in days]


def test_shape_order_and_rebasing():
    ts = torch.tensor([[stamp(2000, 4, 25, 23, 5), 0], [stamp(2003, 2, 28, 0, 30), stamp(2001, 1, 1)]])
    f = time_features(ts, base_year=2000)
    assert f.shape == (2, 2, len(FEATURE_NAMES)) and f.dtype == torch.int64
    # 2000-04-25 was a Tuesday, day 116, ISO week 17; the base year is year 1.
    assert f[0, 0].tolist() == [1, 4, 25, 2, 116, 17, 23]
    assert f[1, 0].tolist() == [4, 2, 28, 5, 59, 9, 0]
    assert f[1, 1, 0].item() == 2


@pytest.mark.parametrize("method", ["table", "unique"])
def test_the_time_encoders_lookups_equal_the_direct_encoding_in_values_and_gradients(method):
    """MOJITO's encoder encodes each value of a calendar feature once and gathers: `table` (CUDA: every value a
    bounded feature can take — fixed shapes, no host sync; the unbounded year encoded directly) or `unique`
    (CPU: the batch's distinct values). Both equal encoding every feature directly, in value and gradient;
    negative years (before base_year) and padding (0) included."""
    from recsys.models.time_features import FEATURE_MAX, MercerTimeEncoding

    torch.manual_seed(0)
    looked_up = MercerTimeEncoding(7, 16, 3, 8.0, FEATURE_MAX)
    looked_up.method = method
    direct = MercerTimeEncoding(7, 16, 3, 8.0)  # no bounds: the table path encodes every feature directly
    direct.method = "table"
    direct.load_state_dict(looked_up.state_dict())
    g = torch.Generator().manual_seed(1)
    top = torch.tensor([10, 13, 32, 8, 367, 54, 24])
    x = (torch.rand(5, 40, 7, generator=g) * top).floor() - torch.tensor([6, 0, 0, 0, 0, 0, 0])
    x[:, :3] = 0  # padding
    assert x[..., 0].min() < 0 and x[..., 4].max() == 366
    outs = []
    for enc in (looked_up, direct):
        out = enc(x)
        (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
        outs.append((out.detach(), [p.grad for p in enc.parameters()]))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-6)
    for a, b in zip(outs[0][1], outs[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_the_time_encoder_puts_a_tabled_feature_before_a_direct_one_back_in_place():
    from recsys.models.time_features import MercerTimeEncoding

    torch.manual_seed(0)
    mixed = MercerTimeEncoding(3, 4, 2, 2.0, (5, None, 9))
    mixed.method = "table"
    direct = MercerTimeEncoding(3, 4, 2, 2.0)
    direct.method = "table"
    direct.load_state_dict(mixed.state_dict())
    x = torch.tensor([[[0.0, -3.0, 9.0], [5.0, 40.0, 1.0]]])
    torch.testing.assert_close(mixed(x), direct(x))
    with pytest.raises(ValueError, match="bounds has 2 entries for 7 features"):
        MercerTimeEncoding(7, 16, 3, 8.0, (None, 12))
