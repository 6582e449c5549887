"""`recsys recommend`: always an answer — the champion, the baseline champion, or popularity — and it says which
version answered and why (`--user`, `--history`, `--json`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_registry_cli import _prepared, invoke, open_from, write_params
from test_registry_support import make_eval

from recsys.commands.recommend import app as recommend_app
from recsys.recommend import MAX_K

ANSWER_KEYS = {"source", "reason", "model_version", "architecture", "champion_version", "k", "at", "user",
               "history", "skipped_items", "recommendations", "empty_because"}


def mostpop_checkpoint(root: Path, name: str, counts: list[int], users: list[str]) -> Path:
    """A real MostPop checkpoint over items m1..m4 whose popularity follows `counts` (item id per event)."""
    from recsys.checkpoint import save_checkpoint
    from recsys.models.mostpop import MostPop, MostPopConfig

    model = MostPop(MostPopConfig(), n_items=4, n_users=len(users))
    model.fit_statistics(torch.tensor(counts))
    return save_checkpoint(root / "ckpt" / name, model, dataset_fingerprint="d" * 64,
                           item_ids=["m1", "m2", "m3", "m4"], user_ids=users)


# Baseline: m1 > m2 > m3 > m4, knows alice, bob and carol. Champion: m4 > m3 > m2 > m1, knows alice and bob.
BASELINE_COUNTS = [1, 1, 1, 1, 2, 2, 2, 3, 3, 4]
CHAMPION_COUNTS = [4, 4, 4, 4, 3, 3, 3, 2, 2, 1]


def recommend_json(params_path: Path, *args: str) -> dict:
    out = invoke(recommend_app, *args, "--json", "--params", str(params_path))
    assert out.exit_code == 0, out.output
    answer = json.loads(out.output)
    assert set(answer) == ANSWER_KEYS
    for rec in answer["recommendations"]:
        assert set(rec) == {"rank", "item_id", "title", "score"}
    return answer


def setup(tmp_path: Path, with_champion: bool) -> Path:
    params_path = write_params(tmp_path)
    _prepared(tmp_path)  # alice saw m1 then m3; bob saw m4
    with open_from(params_path) as reg:
        base = mostpop_checkpoint(tmp_path, "base", BASELINE_COUNTS, ["alice", "bob", "carol"])
        assert reg.install_baseline(base, make_eval(-0.15, seed=1), dataset_version="d1") == 1
        if with_champion:
            champ = mostpop_checkpoint(tmp_path, "champ", CHAMPION_COUNTS, ["alice", "bob"])
            assert reg.promote(champ, make_eval(0.0, seed=2)).promoted
    return params_path


def test_baseline_champion_answers_before_any_model_passes_the_gate(tmp_path):
    params_path = setup(tmp_path, with_champion=False)
    answer = recommend_json(params_path, "--user", "alice", "-k", "2")
    assert answer["source"] == "baseline_champion" and answer["model_version"] == answer["champion_version"] == 1
    assert "no model has passed the gate" in answer["reason"]
    assert [r["item_id"] for r in answer["recommendations"]] == ["m2", "m4"]  # m1, m3 already seen
    text = invoke(recommend_app, "--user", "alice", "-k", "2", "--params", str(params_path))
    assert text.exit_code == 0 and "from v1 (mostpop) [baseline_champion]" in text.output.splitlines()[0]
    assert "not in the prepared dataset" not in answer["reason"]
    typo = recommend_json(params_path, "--user", "alcie", "-k", "2")  # answered, and says who it does not know
    assert typo["source"] == "baseline_champion" and typo["reason"].endswith(
        "; user 'alcie' is not in the prepared dataset (new, a typo, or with fewer events than prepare's minimum)")


def test_a_user_the_champion_never_saw_gets_popularity_from_the_baseline(tmp_path):
    params_path = setup(tmp_path, with_champion=True)
    known = recommend_json(params_path, "--user", "alice", "-k", "2")
    assert known["source"] == "champion" and known["model_version"] == known["champion_version"] == 2
    assert [r["item_id"] for r in known["recommendations"]] == ["m4", "m2"]  # the champion's order

    for user in ("carol", "zed"):  # carol: known to the baseline only; zed: known to no model
        answer = recommend_json(params_path, "--user", user, "-k", "3")
        assert answer["source"] == "popularity_fallback", answer
        assert answer["model_version"] == 1 and answer["champion_version"] == 2
        # Neither is in the prepared dataset: "trained before they arrived" was a guess (a user prepare's
        # filters dropped is older than the champion).
        assert (f"user {user!r} is not in the prepared dataset (new, a typo, or with fewer events than "
                "prepare's minimum); their items are not known to be excluded") in answer["reason"]
        assert answer["user"] == user and answer["history"] is None
        assert [r["item_id"] for r in answer["recommendations"]] == ["m1", "m2", "m3"]
    text = invoke(recommend_app, "--user", "zed", "--params", str(params_path))
    assert (text.exit_code == 0 and "[popularity_fallback]" in text.output
            and "'zed' is not in the prepared dataset" in text.output)


def test_a_user_of_the_dataset_newer_than_the_champion_gets_popularity_without_their_items(tmp_path):
    params_path = write_params(tmp_path)
    _prepared(tmp_path)  # alice saw m1 then m3; bob saw m4
    with open_from(params_path) as reg:
        base = mostpop_checkpoint(tmp_path, "base", BASELINE_COUNTS, ["alice", "bob"])
        assert reg.install_baseline(base, make_eval(-0.15, seed=1), dataset_version="d1") == 1
        champ = mostpop_checkpoint(tmp_path, "champ", CHAMPION_COUNTS, ["alice"])  # trained before bob came
        assert reg.promote(champ, make_eval(0.0, seed=2)).promoted
    answer = recommend_json(params_path, "--user", "bob", "-k", "4")
    assert answer["source"] == "popularity_fallback"
    assert "user 'bob' arrived after champion v2 was trained" in answer["reason"]
    assert [r["item_id"] for r in answer["recommendations"]] == ["m1", "m2", "m3"]  # four asked: m4 is his


def test_history_is_scored_by_the_champion_and_unknown_items_are_skipped_and_reported(tmp_path):
    params_path = setup(tmp_path, with_champion=True)
    answer = recommend_json(params_path, "--history", "m4,new-item,m2", "-k", "4", "--at", "2024-05-01T20:00:00Z")
    assert answer["source"] == "champion" and answer["model_version"] == 2
    assert answer["history"] == ["m4", "new-item", "m2"] and answer["skipped_items"] == ["new-item"]
    assert [r["item_id"] for r in answer["recommendations"]] == ["m3", "m1"]  # history items never shown
    assert answer["at"] == "2024-05-01T20:00:00+00:00" and answer["user"] is None
    assert answer["recommendations"][0]["title"] == "Three"  # titles from the prepared dataset (m3)

    text = invoke(recommend_app, "--history", "m4,new-item", "--params", str(params_path))
    assert text.exit_code == 0
    assert text.output.splitlines()[-1] == "note: skipped 1 history item(s) unknown to v2: new-item"

    nothing_known = recommend_json(params_path, "--history", "x1,x2")
    assert nothing_known["source"] == "popularity_fallback" and nothing_known["model_version"] == 1
    assert "none of the history's items is known to champion v2" in nothing_known["reason"]
    assert nothing_known["skipped_items"] == ["x1", "x2"]


def test_a_user_the_champion_knows_but_the_prepared_dataset_lacks_is_said_to_be_unknown_here(tmp_path):
    """bob is in the champion's vocabulary but not in the prepared dataset (prepare's filters dropped him, or
    --prepared names an older one): the reason said he "has no events for champion v2 to score", as if his
    seen items had been excluded."""
    import pandas as pd

    params_path = setup(tmp_path, with_champion=True)
    prepared = tmp_path / "artifacts" / "prepared"
    for name in ("users", "events"):  # bob is user 2 there
        table = pd.read_parquet(prepared / f"{name}.parquet")
        table[table["user"] != 2].to_parquet(prepared / f"{name}.parquet")
    answer = recommend_json(params_path, "--user", "bob", "-k", "4")
    assert answer["source"] == "popularity_fallback" and answer["model_version"] == 1
    assert answer["reason"].startswith(
        "popularity fallback: user 'bob' is not in the prepared dataset (new, a typo, or with fewer events than "
        "prepare's minimum); their items are not known to be excluded; "), answer["reason"]
    assert [r["item_id"] for r in answer["recommendations"]] == ["m1", "m2", "m3", "m4"]


def test_a_named_prepared_folder_without_a_prepared_dataset_is_refused_for_a_history_too(tmp_path):
    """`--history` answers without a prepared dataset when none was named (the default folder may not be
    built yet); one the person named must be one."""
    params_path = setup(tmp_path, with_champion=True)
    (tmp_path / "empty").mkdir()
    result = invoke(recommend_app, "--history", "m4", "--prepared", str(tmp_path / "empty"),
                    "--params", str(params_path))
    assert result.exit_code == 1 and result.output.startswith(
        f"error: prepared dataset not found under {tmp_path / 'empty'} ("), result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_damaged_prepared_file_is_one_line_naming_it_and_what_rebuilds_it(tmp_path):
    """It was "error: Parquet file size is 5 bytes, smaller than the minimum file footer (8 bytes)": no file,
    no way out."""
    params_path = setup(tmp_path, with_champion=True)
    events = tmp_path / "artifacts" / "prepared" / "events.parquet"
    events.write_text("junk")
    result = invoke(recommend_app, "--user", "alice", "--params", str(params_path))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {events} cannot be read as Parquet (") and lines[0].endswith(
        "; `recsys bootstrap && dvc repro prepare` builds it (the flows and `bash scripts/demo.sh` do)"), lines[0]


def test_a_fraction_of_a_second_before_1970_stays_before_it():
    """`int(timestamp())` truncated toward 1970: 23:59:59.5 on 1969-12-31 answered as of 1970-01-01."""
    from recsys.commands.recommend import parse_time

    assert parse_time("1969-12-31T23:59:59.5Z") == -1
    assert parse_time("1970-01-01T00:00:00.5Z") == 0
    assert parse_time("0001-01-01T00:00:00Z") == -62135596800
    assert parse_time("9999-12-31T23:59:59.999999Z") == 253402300799


def test_history_works_without_a_prepared_dataset(tmp_path):
    params_path = setup(tmp_path, with_champion=True)
    import shutil

    shutil.rmtree(tmp_path / "artifacts" / "prepared")
    answer = recommend_json(params_path, "--history", "m4", "-k", "1")
    assert [r["item_id"] for r in answer["recommendations"]] == ["m3"] and answer["recommendations"][0]["title"] is None


def test_request_errors_are_one_line(tmp_path):
    params_path = setup(tmp_path, with_champion=False)
    both = invoke(recommend_app, "--user", "alice", "--history", "m1", "--params", str(params_path))
    neither = invoke(recommend_app, "--params", str(params_path))
    empty = invoke(recommend_app, "--history", "m1,,m2", "--params", str(params_path))
    nobody = invoke(recommend_app, "--user", "", "--params", str(params_path))
    when = invoke(recommend_app, "--user", "alice", "--at", "yesterday", "--params", str(params_path))
    joined = invoke(recommend_app, "--user", "alice", "--at", "2024-05-01x12:00:00", "--params", str(params_path))
    # Valid ISO-8601 that UTC cannot hold: it was "error: year 0 is out of range", exit 1, after the registry
    # was opened.
    too_early = invoke(recommend_app, "--user", "alice", "--at", "0001-01-01T00:00:00+01:00",
                       "--params", str(params_path))
    too_late = invoke(recommend_app, "--history", "m1", "--at", "9999-12-31T23:59:59-23:59",
                      "--params", str(params_path))
    # Click gives an option's value from the next token: it answered for a user named "--json"
    optionish = invoke(recommend_app, "--user", "--json", "--params", str(params_path))
    history_optionish = invoke(recommend_app, "--history", "--json", "--params", str(params_path))
    # A --prepared named but not there was ignored (no titles, a history's seen items unknown, no note);
    # '' was the current folder; a file was "[Errno 20] Not a directory", exit 1
    (tmp_path / "a-file").write_text("x")
    prepared_gone, prepared_empty, prepared_file = (
        invoke(recommend_app, "--history", "m1", "--prepared", where, "--params", str(params_path))
        for where in (str(tmp_path / "nowhere"), "", str(tmp_path / "a-file")))
    for result, code, fragment in ((both, 2, "exactly one of --user ID or --history I1,I2,... (see"),
                                   (neither, 2, "exactly one of"),
                                   (empty, 2, "'m1,,m2'"), (nobody, 2, "--user is empty"),
                                   (when, 2, "--at 'yesterday' is not an ISO-8601 time"),
                                   (joined, 2, "--at '2024-05-01x12:00:00' is not an ISO-8601 time"),
                                   (too_early, 2, ("--at '0001-01-01T00:00:00+01:00' is outside the years 1 "
                                                   "to 9999 in UTC")),
                                   (too_late, 2, "--at '9999-12-31T23:59:59-23:59' is outside the years"),
                                   (optionish, 2, "--user '--json' looks like an option: give --user's value"),
                                   (history_optionish, 2, "--history '--json' looks like an option"),
                                   (prepared_gone, 2, (f"--prepared '{tmp_path / 'nowhere'}' does not exist: "
                                                       "name prepare's output folder")),
                                   (prepared_empty, 2, "--prepared '' is empty"),
                                   (prepared_file, 2, f"--prepared '{tmp_path / 'a-file'}' is a file")):
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == code and len(lines) == 1 and fragment in lines[0], result.output
        # a command line that does not parse names the command and where its help is, as Click's refusals do
        assert lines[0].startswith("error: recsys recommend: "), lines[0]
        assert lines[0].endswith("(see 'recsys recommend --help')"), lines[0]


def test_before_anything_is_registered_dataset_popularity_answers_and_says_so(tmp_path):
    """A first `dvc repro` has run but nothing was gated yet: still an answer, from item popularity in the
    prepared dataset; with no prepared dataset either, one line saying what builds one."""
    params_path = write_params(tmp_path)
    nothing = invoke(recommend_app, "--history", "m1", "--params", str(params_path))
    assert nothing.exit_code == 1
    assert nothing.output.strip().splitlines() == [
        ("error: nothing can answer yet: no model is registered and there is no prepared dataset to count "
         "popularity in; `python -m flows.pipeline` (or `bash scripts/demo.sh` on the embedded data) trains, gates "
         "and registers one — or `dvc repro` then `recsys registry promote --model mostpop`")]
    _prepared(tmp_path)  # alice saw m1 then m3; bob saw m4
    for args, expected in ((["--user", "alice"], {"m4"}), (["--history", "m4"], {"m1", "m3"})):
        answer = recommend_json(params_path, *args, "-k", "3")
        assert answer["source"] == "popularity_fallback"
        assert answer["champion_version"] is None and answer["model_version"] is None
        assert answer["architecture"] == "dataset popularity"
        assert answer["reason"].startswith("popularity fallback: no champion is registered yet in "
                                           "sqlite:///registry/registry.db; item popularity")
        assert {r["item_id"] for r in answer["recommendations"]} == expected  # seen items never shown
        assert "not in the prepared dataset" not in answer["reason"]
    typo = recommend_json(params_path, "--user", "alcie", "-k", "3")
    assert typo["reason"].endswith("; user 'alcie' is not in the prepared dataset (new, a typo, or with fewer "
                                   "events than prepare's minimum)")
    text = invoke(recommend_app, "--user", "alice", "--params", str(params_path))
    assert text.exit_code == 0
    assert text.output.splitlines()[0] == ("top 10 for user alice from dataset popularity [popularity_fallback]: "
                                           "popularity fallback: no champion is registered yet in "
                                           "sqlite:///registry/registry.db; item popularity in the prepared "
                                           "dataset answers (no baseline version is registered)")


def test_a_user_with_nothing_the_champion_can_score_gets_popularity_not_padding_scores(tmp_path):
    """A known user before their first event (`--at`) fed the champion an empty history: every SASRec score
    was 0.0 and index order came out labelled `champion`."""
    params_path = setup(tmp_path, with_champion=True)
    early = recommend_json(params_path, "--user", "alice", "-k", "2", "--at", "2001-01-01T00:00:00Z")
    assert early["source"] == "popularity_fallback" and early["model_version"] == 1, early
    assert (
        "user 'alice' has no events up to 2001-01-01T00:00:00+00:00 for champion v2 to score"
        in early["reason"]
    )
    assert [r["item_id"] for r in early["recommendations"]] == ["m1", "m2"]  # the baseline's order
    later = recommend_json(params_path, "--user", "alice", "-k", "2")  # her events are known: the champion
    assert later["source"] == "champion"


def test_dataset_popularity_as_of_a_time_counts_no_event_after_it(tmp_path):
    """Nothing registered: popularity from the prepared dataset, counted up to `--at`
    (it counted them all)."""
    params_path = write_params(tmp_path)
    _prepared(tmp_path)  # m1 at 1_700_000_000 (bob), m4 at 1_700_000_000 and m3 at 1_700_000_100 (alice)
    before_m3 = recommend_json(params_path, "--history", "x", "--at", "2023-11-14T22:14:00Z")  # 1_700_000_040
    assert before_m3["source"] == "popularity_fallback"
    assert {r["item_id"] for r in before_m3["recommendations"]} == {"m1", "m4"}
    nothing_yet = recommend_json(params_path, "--history", "x", "--at", "2001-01-01T00:00:00Z")
    assert nothing_yet["recommendations"] == [] and nothing_yet["empty_because"] == "nothing_counted"
    assert nothing_yet["reason"].endswith("; the prepared dataset holds no events up to 2001-01-01T00:00:00+00:00 "
                                          "to count")  # not "the history covers every item"
    text = invoke(recommend_app, "--history", "x", "--at", "2001-01-01T00:00:00Z", "--params", str(params_path))
    assert text.exit_code == 0 and text.output.splitlines()[1:] == [
        "(nothing to recommend: see above)", "note: skipped 1 history item(s) unknown to the prepared dataset: x"]
    covered = invoke(recommend_app, "--history", "m1,m3,m4", "--params", str(params_path))  # all it counts
    assert covered.output.splitlines()[1:] == [
        "(nothing left to recommend: the history covers every item the answer could rank)"]
    assert recommend_json(params_path, "--history", "m1,m3,m4")["empty_because"] == "history_covers_all"
    everything = recommend_json(params_path, "--history", "x")
    assert {r["item_id"] for r in everything["recommendations"]} == {"m1", "m3", "m4"}
    assert everything["empty_because"] is None


def test_dataset_popularity_reports_the_history_items_the_dataset_lacks(tmp_path):
    """Before anything was registered, a `--history` with a typo in it was answered without a word about
    the item it could not place (the models' answers report theirs)."""
    params_path = write_params(tmp_path)
    _prepared(tmp_path)  # items m1..m4; m1, m3 and m4 have events
    answer = recommend_json(params_path, "--history", "m3,m33,new-item")
    assert answer["source"] == "popularity_fallback" and answer["model_version"] is None
    assert answer["skipped_items"] == ["m33", "new-item"]
    assert {r["item_id"] for r in answer["recommendations"]} == {"m1", "m4"}  # m3 is in the history
    text = invoke(recommend_app, "--history", "m3,m33,new-item", "--params", str(params_path))
    assert text.exit_code == 0
    assert text.output.splitlines()[-1] == ("note: skipped 2 history item(s) unknown to the prepared dataset: "
                                            "m33, new-item")
    assert recommend_json(params_path, "--history", "m1,m3")["skipped_items"] == []


BAD_COUNTS = ["1.0", " 3", "2 ", "+2", "1_0", "0", "-1", "01", "1e3", "", "٣", "1001"]


@pytest.mark.parametrize("bad", BAD_COUNTS)
def test_k_is_parsed_strictly(tmp_path, bad):
    """Click's int took "1.0", " 3", "+2" and "1_0" (as 10); -k is a plain whole number from 1 to MAX_K."""
    params_path = setup(tmp_path, with_champion=False)
    result = invoke(recommend_app, "--user", "alice", "-k", bad, "--params", str(params_path))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0] == (f"error: recsys recommend: -k {bad!r} is not a whole number from 1 to {MAX_K} "
                        "(see 'recsys recommend --help')")
    assert recommend_json(params_path, "--user", "alice", "-k", str(MAX_K))["k"] == MAX_K


def test_after_a_rollback_to_the_baseline_the_answer_says_a_model_had_passed(tmp_path):
    """It said "no model has passed the gate yet" although v2 had: the reason comes from the history."""
    params_path = setup(tmp_path, with_champion=True)
    with open_from(params_path) as reg:
        reg.rollback()
    answer = recommend_json(params_path, "--user", "alice", "-k", "2")
    assert answer["source"] == "baseline_champion" and answer["champion_version"] == 1
    assert answer["reason"] == ("baseline champion v1 answers: the champion was rolled back to it (v2 passed the "
                                "gate; `recsys registry history` says when)")
    # The baseline refreshed after that rollback: it said v3 was "rolled back to", and the refresh's own
    # event said "no model has passed the gate yet"
    with open_from(params_path) as reg:
        fresh = mostpop_checkpoint(tmp_path, "fresh", BASELINE_COUNTS + [1], ["alice", "bob", "carol"])
        assert reg.install_baseline(fresh, make_eval(-0.14, seed=3), dataset_version="d2") == 3
        assert reg.history()[-1].reason == ("baseline champion refreshed: v3 (mostpop) replaces baseline v1; the "
                                            "champion had been rolled back to the baseline")
    answer = recommend_json(params_path, "--user", "alice", "-k", "2")
    assert answer["source"] == "baseline_champion" and answer["champion_version"] == 3
    assert answer["reason"] == ("baseline champion v3 answers: it refreshed the baseline the champion had been "
                                "rolled back to (v2 passed the gate; `recsys registry history` says when)")


@pytest.mark.parametrize("damage", ["users without user_id", "items without item_id", "events without timestamp",
                                    "an item items.parquet lacks"])
def test_a_prepared_folder_that_is_not_a_prepared_dataset_is_one_line(tmp_path, damage):
    """A wrong or stale --prepared was a KeyError traceback, a multi-line Arrow error, or blank item ids."""
    import pandas as pd

    params_path = setup(tmp_path, with_champion=True)
    prepared = tmp_path / "artifacts" / "prepared"
    name, column = {"users without user_id": ("users", "user_id"), "items without item_id": ("items", "item_id"),
                    "events without timestamp": ("events", "timestamp"),
                    "an item items.parquet lacks": ("items", None)}[damage]
    table = pd.read_parquet(prepared / f"{name}.parquet")
    table = table.drop(columns=[column]) if column else table[table["item_id"] != "m4"]
    table.to_parquet(prepared / f"{name}.parquet")
    result = invoke(recommend_app, "--user", "alice", "--params", str(params_path))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    if column:
        assert lines[0] == (f"error: {prepared / name}.parquet is not a prepared dataset's: it lacks column(s) "
                            f"{column}; point --prepared at prepare's output, or `recsys bootstrap && dvc repro "
                            "prepare` builds it (the flows and `bash scripts/demo.sh` do)")
    else:
        assert lines[0].startswith(f"error: {prepared} is not one prepared dataset: 1 event(s) name an item")


def test_under_mask_seen_false_popularity_and_the_champion_may_answer_with_the_users_own_items(tmp_path):
    """Repeat-consumption data (`evaluate.mask_seen: false`): dataset popularity keeps the history's items;
    a champion trained under the rule (its checkpoint says so) serves them; one saved under the default
    still masks them, as it was gated."""
    params_path = write_params(tmp_path)
    params_path.write_text(params_path.read_text() + "evaluate:\n  mask_seen: false\n")
    _prepared(tmp_path)  # alice saw m1 then m3; bob saw m4
    answer = recommend_json(params_path, "--user", "alice", "-k", "3")
    assert answer["source"] == "popularity_fallback"
    assert {"m1", "m3"} <= {r["item_id"] for r in answer["recommendations"]}
    with open_from(params_path) as reg:
        base = mostpop_checkpoint(tmp_path, "base", BASELINE_COUNTS, ["alice", "bob", "carol"])
        assert reg.install_baseline(base, make_eval(-0.15, seed=1), dataset_version="d1") == 1
    masked = recommend_json(params_path, "--user", "alice", "-k", "4")  # saved without the key: masks
    assert [r["item_id"] for r in masked["recommendations"]] == ["m2", "m4"]
    champ = mostpop_checkpoint(tmp_path, "champ", CHAMPION_COUNTS, ["alice", "bob"])
    meta = json.loads((champ / "model.json").read_text())
    (champ / "model.json").write_text(json.dumps({**meta, "mask_seen": False}))  # as train_model records it
    with open_from(params_path) as reg:
        assert reg.promote(champ, make_eval(0.0, seed=2)).promoted
    served = recommend_json(params_path, "--user", "alice", "-k", "4")
    assert served["source"] == "champion"
    assert [r["item_id"] for r in served["recommendations"]] == ["m4", "m3", "m2", "m1"]  # m1, m3 served again
