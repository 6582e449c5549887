"""params.yaml → frozen dataclasses: strict keys and types, per-model train overrides, safe names."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml
from flow_support import modules_loaded_by

from recsys.config import (
    DEFAULT_PARAMS,
    ConfigError,
    GenerateConfig,
    TrainConfig,
    load_params,
    parse_params,
    read_params,
    validate_name,
)


def test_parsing_params_never_loads_torch(repo_root):
    """Every flow run, command and stage parses params.yaml; one that builds no model must not pay for torch."""
    params = str(repo_root / DEFAULT_PARAMS)
    loaded = modules_loaded_by(f"from recsys.config import load_params; load_params({params!r})")
    assert "recsys.config" in loaded and "torch" not in loaded and "recsys.models" not in loaded


def test_repository_params_load(repo_root):
    params = load_params(repo_root / DEFAULT_PARAMS)
    raw = yaml.safe_load((repo_root / DEFAULT_PARAMS).read_text())
    assert params.models == tuple(raw["models"])
    assert params.train.epochs == raw["train"]["epochs"]
    assert params.evaluate.ks == tuple(raw["evaluate"]["ks"])
    assert params.model_config("sasrec").dim == raw["sasrec"]["dim"]


def test_defaults_when_sections_absent():
    params = parse_params({})
    assert params.models == ("mostpop", "sasrec")
    assert params.train == TrainConfig() and params.generate == GenerateConfig()


@pytest.mark.parametrize(
    "raw, key",
    [
        ({"train": {"epochz": 3}}, "epochz"),
        ({"prepare": {"min_users": 3}}, "min_users"),
        ({"ingest": {"column_map": {}}}, "column_map"),
        ({"sasrec": {"dimm": 32}}, "dimm"),
        ({"mostpop": {"alpha": 1}}, "alpha"),
        ({"sasrec": {"train": {"learning_rate": 0.1}}}, "learning_rate"),
        ({"trian": {"epochs": 3}}, "trian"),
    ],
)
def test_unknown_key_is_named(raw, key):
    with pytest.raises(ConfigError, match=key):
        parse_params(raw)


@pytest.mark.parametrize(
    "raw, where",
    [
        ({"train": {"epochs": "ten"}}, "train.epochs"),
        ({"train": {"epochs": 3.5}}, "train.epochs"),
        ({"train": {"epochs": True}}, "train.epochs"),
        ({"train": {"lr": "fast"}}, "train.lr"),
        ({"train": {"device": "tpu"}}, "train.device"),
        ({"prepare": {"split": "random"}}, "prepare.split"),
        ({"evaluate": {"ks": 10}}, "evaluate.ks"),
        ({"evaluate": {"ks": [5, "ten"]}}, "evaluate.ks"),
        ({"ingest": {"dvc_push": "yes"}}, "ingest.dvc_push"),
        ({"registry": {"url": 5}}, "registry.url"),
        ({"sasrec": {"dim": "big"}}, "sasrec.dim"),
        ({"sasrec": {"loss": "mse"}}, "sasrec.loss"),
        ({"sasrec": {"train": {"epochs": "x"}}}, "sasrec.train.epochs"),
        ({"train": [1, 2]}, "train"),
        ({"train": {"init": "hot"}}, "train.init"),
        ({"train": {"cpu_allocator": "jemalloc"}}, "train.cpu_allocator"),
        ({"train": {"precision": "fp16"}}, "train.precision"),
        ({"bert4rec": {"train": {"precision": "half"}}}, "bert4rec.train.precision"),
        ({"sasrec": {"train": {"init": "tepid"}}}, "sasrec.train.init"),
        ({"train": {"warm_cold_every": -1}}, "train.warm_cold_every"),
        ({"train": {"warm_max_catalogue_growth": -0.5}}, "train.warm_max_catalogue_growth"),
    ],
)
def test_wrong_type_is_an_error(raw, where):
    with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
        parse_params(raw)


@pytest.mark.parametrize("raw, message", [
    ({"train": {"epochs": -1}}, "train.epochs must be from 1 to 1,000,000 (whole epochs), got -1"),
    ({"train": {"epochs": 0}}, "train.epochs must be from 1 to 1,000,000"),
    ({"train": {"patience": 0}}, "train.patience must be from 1 to 1,000,000"),
    ({"train": {"lr": -1.0}}, ("train.lr must be a finite number >= 0 (0 = the weights stay as initialised), "
                               "got -1.0")),
    ({"train": {"lr": float("nan")}}, ("train.lr must be a finite number >= 0 (0 = the weights stay as "
                                       "initialised), got nan")),
    ({"train": {"max_minutes": -5.0}}, ("train.max_minutes must be a finite number >= 0 (0 = no time limit), "
                                        "got -5.0")),
    ({"train": {"grad_clip": -1}}, "train.grad_clip must be a finite number >= 0 (0 = no clipping)"),
    ({"train": {"weight_decay": float("inf")}},
     "train.weight_decay must be a finite number >= 0 (0 = none), got inf"),
    ({"sasrec": {"train": {"lr": -2.0}}}, "sasrec.train.lr must be a finite number >= 0"),
    ({"ingest": {"store": "raw"}}, ("ingest.store must be 'data' (the raw store data.dvc versions and dvc.yaml's "
                                    "prepare stage reads; the layout is fixed), got 'raw': remove the setting")),
])
def test_values_out_of_range_are_refused_with_the_key_and_value(raw, message):
    """A run that cannot train (no epochs, a negative rate or clock) is refused at parse time, before a stage
    reports success with the old checkpoint left in place."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_params(raw)


SEED = "in [0, 4294967295] (2**32 - 1)"


@pytest.mark.parametrize("raw, message", [
    # the settings every transformer model shares (dim, n_layers, n_heads, dropout, max_len)
    ({"sasrec": {"dim": 0}}, "sasrec.dim must be >= 1, got 0"),  # was a ZeroDivisionError
    ({"sasrec": {"dim": -2}}, "sasrec.dim must be >= 1, got -2"),  # was RuntimeError: negative dimension
    ({"sasrec": {"n_layers": 0}}, "sasrec.n_layers must be >= 1, got 0"),
    ({"sasrec": {"n_heads": 0}}, "sasrec.n_heads must be >= 1, got 0"),  # ZeroDivisionError on every command
    ({"sasrec": {"n_heads": 3}}, "sasrec.n_heads must be a divisor of dim (64), got 3"),
    ({"sasrec": {"dropout": 1.5}}, "sasrec.dropout must be in [0, 1), got 1.5"),
    ({"sasrec": {"dropout": 1.0}}, "sasrec.dropout must be in [0, 1), got 1.0"),
    ({"sasrec": {"max_len": 0}}, "sasrec.max_len must be >= 1, got 0"),
    ({"sasrec": {"loss": "sampled_ce", "n_negatives": 0}}, "sasrec.n_negatives must be >= 1, got 0"),
    ({"sasrec": {"item_dropout": -0.1}}, "sasrec.item_dropout must be in [0, 1), got -0.1"),
    ({"bert4rec": {"dim": 0}}, "bert4rec.dim must be >= 1, got 0"),
    ({"bert4rec": {"n_heads": 3}}, "bert4rec.n_heads must be a divisor of dim (64), got 3"),
    ({"bert4rec": {"dropout": float("nan")}}, "bert4rec.dropout must be in [0, 1), got nan"),
    ({"bert4rec": {"max_len": -1}}, "bert4rec.max_len must be >= 1, got -1"),
    ({"bert4rec": {"ffn_dim": 0}}, "bert4rec.ffn_dim must be >= 1, got 0"),
    ({"bert4rec": {"loss": "sampled_ce", "n_negatives": -8}}, "bert4rec.n_negatives must be >= 1, got -8"),
    ({"bert4rec": {"mask_prob": 0.0}}, "bert4rec.mask_prob must be in (0, 1], got 0.0"),
    ({"bert4rec": {"last_item_share": 1.5}}, "bert4rec.last_item_share must be in [0, 1], got 1.5"),
    ({"mojito": {"n_layers": -1}}, "mojito.n_layers must be >= 1, got -1"),
    ({"mojito": {"n_heads": 0}}, "mojito.n_heads must be >= 1, got 0"),
    ({"mojito": {"n_heads": 3}}, "mojito.n_heads must be a divisor of 2*dim (128), got 3"),
    ({"mojito": {"dropout": -0.2}}, "mojito.dropout must be in [0, 1), got -0.2"),
    ({"mojito": {"time_dim": 0}}, "mojito.time_dim must be >= 1, got 0"),
    ({"mojito": {"time_expand": 0}}, "mojito.time_expand must be >= 1, got 0"),
    ({"mojito": {"time_linspace": float("inf")}}, "mojito.time_linspace must be a finite number, got inf"),
    ({"mojito": {"noise_init": -0.1}}, "mojito.noise_init must be a finite number >= 0, got -0.1"),
    ({"mojito": {"long_weight": float("nan")}}, "mojito.long_weight must be a finite number >= 0, got nan"),
    ({"mojito": {"fism_items": 0}}, "mojito.fism_items must be >= 1, got 0"),
    ({"mojito": {"fism_attention": 1.5}}, "mojito.fism_attention must be in [0, 1], got 1.5"),
    # the train section, and a model's own train mapping named where it was written
    ({"train": {"seed": -1}}, f"train.seed must be {SEED}, got -1"),  # was numpy's traceback
    ({"train": {"seed": 2**32}}, f"train.seed must be {SEED}, got 4294967296"),
    ({"sasrec": {"train": {"seed": -1}}}, f"sasrec.train.seed must be {SEED}, got -1"),
    ({"train": {"batch_size": 0}}, "train.batch_size must be >= 1, got 0"),
    ({"train": {"lr_reference_batch": -1}}, "train.lr_reference_batch must be >= 1, got -1"),
    ({"bert4rec": {"train": {"epochs": 0}}},
     "bert4rec.train.epochs must be from 1 to 1,000,000 (whole epochs), got 0"),
    ({"train": {"epochs": 10**20}},  # was accepted: a run without end
     "train.epochs must be from 1 to 1,000,000 (whole epochs), got 100000000000000000000"),
    ({"sasrec": {"train": {"patience": 1_000_001}}},
     "sasrec.train.patience must be from 1 to 1,000,000 (whole epochs), got 1000001"),
    # a model's section that is no mapping (was a TypeError or ValueError traceback on every command)
    ({"sasrec": 5}, "sasrec: expected a mapping, got int"),
    ({"mostpop": [1]}, "mostpop: expected a mapping, got list"),
    ({"mojito": "x"}, "mojito: expected a mapping, got str"),
    ({"mojito": {"train": {"ema": 1.0}}}, ("mojito.train.ema must be in [0, 1) (0 = off; the decay of the "
                                           "weights' moving average per optimiser step), got 1.0")),
])
def test_model_and_train_settings_out_of_range_name_the_dotted_key_the_value_and_the_range(raw, message):
    """Each was a traceback (or a misleading later error) when a model was built, or on every command."""
    with pytest.raises(ConfigError) as err:
        parse_params(raw)
    assert str(err.value) == message


@pytest.mark.parametrize("raw", [
    {"sasrec": {"dim": 1, "n_heads": 1, "n_layers": 1, "max_len": 1, "dropout": 0.0, "n_negatives": 1,
                "item_dropout": 0.0}},
    {"bert4rec": {"dim": 8, "n_heads": 8, "ffn_dim": 1, "mask_prob": 1.0, "last_item_share": 0.0}},
    {"bert4rec": {"last_item_share": 1.0}},
    {"mojito": {"dim": 3, "n_heads": 6, "time_dim": 1, "time_expand": 1, "time_linspace": -2.0,
                "noise_init": 0.0, "long_weight": 0.0, "fism_items": 1, "fism_attention": 0.0}},
    {"mojito": {"fism_attention": 1.0}},
    {"train": {"seed": 0}}, {"train": {"seed": 2**32 - 1}}, {"train": {"lr": 0.0, "batch_size": 1}},
    # n_negatives is read by sampled_ce alone: a checkpoint that set it unused must still load
    {"sasrec": {"loss": "ce", "n_negatives": 0}}, {"bert4rec": {"loss": "ce", "n_negatives": 0}},
])
def test_the_edges_of_each_model_and_train_range_are_accepted(raw):
    assert_reads_back(parse_params(raw), raw)


def assert_reads_back(params, raw: dict) -> None:
    """Every value of `raw` is what the parsed params hold (accepted, not dropped, clamped or defaulted), of
    the same type: sequences compare as tuples, the form the frozen config keeps them in."""
    def same(got, want, where):
        want = tuple(want) if isinstance(want, list) else want
        assert got == want and type(got) is type(want), (where, got)

    for section, values in raw.items():
        for key, value in values.items():
            where = f"{section}.{key}"
            if section == "train":
                same(getattr(params.train, key), value, where)
            elif section in params.model_configs:
                same(getattr(params.model_config(section), key), value, where)
            else:
                same(getattr(getattr(params, section), key), value, where)


@pytest.mark.parametrize("raw, message", [
    ({"gate": {"metric": "foo"}}, ("gate.metric 'foo' is not a metric the evaluate stage writes: with "
                                   "evaluate.ks [5, 10, 20] it must be one of ndcg@5, hr@5, ndcg@10, hr@10, "
                                  "ndcg@20, hr@20, mrr")),
    ({"gate": {"metric": "ndcg@15"}}, "gate.metric 'ndcg@15' is not a metric the evaluate stage writes"),
    ({"gate": {"metric": "NDCG@10"}}, "gate.metric 'NDCG@10' is not a metric the evaluate stage writes"),
    ({"evaluate": {"ks": [5, 20]}}, ("gate.metric 'ndcg@10' is not a metric the evaluate stage writes: "
                                     "with evaluate.ks [5, 20] it must be one of ndcg@5, hr@5, ndcg@20, "
                                    "hr@20, mrr")),
    ({"gate": {"alpha": 2}}, "gate.alpha must be in (0, 1) (the paired test's significance level), got 2.0"),
    ({"gate": {"alpha": -1}}, ("gate.alpha must be in (0, 1) (the paired test's significance level), "
                               "got -1.0")),
    ({"gate": {"alpha": 0}}, "gate.alpha must be in (0, 1)"),
    ({"gate": {"min_delta": -1}},
     "gate.min_delta must be a finite number >= 0 (the gain over the baseline a promotion needs), got -1.0"),
    ({"gate": {"min_delta": float("nan")}}, "gate.min_delta must be a finite number >= 0"),
    ({"evaluate": {"ks": []}}, "evaluate.ks must be a non-empty list of cut-offs >= 1, got []"),
    ({"evaluate": {"ks": [0]}}, "evaluate.ks must be a non-empty list of cut-offs >= 1, got [0]"),
    ({"evaluate": {"ks": [10, -5]}}, "evaluate.ks must be a non-empty list of cut-offs >= 1, got [10, -5]"),
    ({"evaluate": {"batch_size": -1}}, "evaluate.batch_size must be >= 0 (0 = auto), got -1"),
    ({"evaluate": {"sampled_negatives": -1}}, "evaluate.sampled_negatives must be >= 0 (0 = none), got -1"),
    ({"evaluate": {"seed": -1}}, f"evaluate.seed must be {SEED}, got -1"),
    ({"prepare": {"test_quantile": 1.5}}, "prepare.test_quantile must be in (0, 1), got 1.5"),
    ({"prepare": {"valid_quantile": 0.0}}, "prepare.valid_quantile must be in (0, 1), got 0.0"),
    ({"prepare": {"valid_quantile": 0.9, "test_quantile": 0.8}}, ("prepare.test_quantile must be above "
     "prepare.valid_quantile (0.9): the validation period ends where the test period starts, got 0.8")),
    ({"prepare": {"min_user_interactions": -1}}, "prepare.min_user_interactions must be >= 1, got -1"),
    ({"prepare": {"min_item_interactions": 0}}, "prepare.min_item_interactions must be >= 1, got 0"),
    ({"ingest": {"max_bad_row_share": 2}}, "ingest.max_bad_row_share must be in [0, 1], got 2.0"),
    ({"ingest": {"max_unseen_user_share": -0.1}}, "ingest.max_unseen_user_share must be in [0, 1], got -0.1"),
    ({"ingest": {"max_unseen_item_share": 1.5}}, "ingest.max_unseen_item_share must be in [0, 1], got 1.5"),
    ({"ingest": {"min_rows": -1}}, "ingest.min_rows must be >= 1, got -1"),
    ({"ingest": {"min_rows": 0}}, "ingest.min_rows must be >= 1, got 0"),
    ({"ingest": {"allowed_events": []}}, ("ingest.allowed_events must be a non-empty list of event names, "
                                          "got []")),
    ({"ingest": {"allowed_events": ["view", ""]}}, ("ingest.allowed_events must be a non-empty list of event "
                                                    "names, got ['view', '']")),
    ({"ingest": {"timestamp_floor": -1}}, ("ingest.timestamp_floor must be >= 0 (UTC seconds since 1970), "
                                           "got -1")),
    ({"ingest": {"max_future_skew_seconds": -1}}, "ingest.max_future_skew_seconds must be >= 0, got -1"),
    ({"ingest": {"inbox": ""}}, "ingest.inbox must be a path relative to the repository root, got ''"),
    ({"ingest": {"quarantine": ""}}, ("ingest.quarantine must be a path relative to the repository root, "
                                      "got ''")),
    ({"generate": {"n_users": 0}}, "generate.n_users must be >= 1, got 0"),
    ({"generate": {"n_users": -1}}, "generate.n_users must be >= 1, got -1"),
    ({"generate": {"n_items": 0}}, "generate.n_items must be >= 1, got 0"),
    ({"generate": {"mean_events_per_user": 0}}, "generate.mean_events_per_user must be >= 1, got 0"),
    ({"generate": {"n_clusters": 0}}, "generate.n_clusters must be >= 1, got 0"),
    ({"generate": {"n_items": 5, "n_clusters": 8}}, ("generate.n_clusters must be at most generate.n_items "
                                                     "(5), got 8")),
    ({"generate": {"start": "notadate"}}, ("generate.start must be an ISO 8601 date and time such as "
                                           "2024-01-01T00:00:00Z, got 'notadate'")),  # was a DateParseError
    ({"generate": {"days": 0}}, "generate.days must be >= 1, got 0"),  # was a ZeroDivisionError
    ({"generate": {"seed": -1}}, f"generate.seed must be {SEED}, got -1"),
    # each ran for as long as it took (killed after minutes, whatever the memory limit)
    ({"generate": {"n_users": 10**12}}, ("generate.mean_events_per_user must be such that generate.n_users × "
                                         "mean_events_per_user is at most 10,000,000 events (the generator holds "
                                         "them all in memory; 1,000,000,000,000 × 40 = 40,000,000,000,000; `recsys "
                                         "data import` takes a real dataset of any size), got 40")),
    ({"generate": {"n_items": 10**9}}, "generate.n_items must be at most 10,000,000, got 1000000000"),
    ({"generate": {"days": 10**6}}, "generate.days must be at most 36,500 (a century), got 1000000"),
    ({"registry": {"artifact_root": ""}}, "registry.artifact_root must be a folder path, got ''"),
])
def test_stage_settings_out_of_range_are_refused_at_load_naming_the_key(raw, message):
    """Each was accepted and then refused every candidate (exit 0), failed mid-run, or was a traceback."""
    with pytest.raises(ConfigError) as err:
        parse_params(raw)
    assert str(err.value).startswith(message), str(err.value)


@pytest.mark.parametrize("raw", [
    {"gate": {"metric": "hr@20", "alpha": 0.5, "min_delta": 0.0}}, {"gate": {"metric": "mrr"}},
    {"evaluate": {"ks": [1, 50], "batch_size": 0, "seed": 2**32 - 1}, "gate": {"metric": "ndcg@50"}},
    {"prepare": {"min_user_interactions": 1, "min_item_interactions": 1, "valid_quantile": 0.01,
                 "test_quantile": 0.99}},
    {"ingest": {"min_rows": 1, "max_bad_row_share": 0.0, "max_unseen_user_share": 1.0, "timestamp_floor": 0,
                "max_future_skew_seconds": 0, "allowed_events": ["view"]}},
    {"generate": {"n_users": 1, "n_items": 1, "n_clusters": 1, "mean_events_per_user": 1, "days": 1,
                  "start": "2024-01-01", "seed": 0}},
    {"generate": {"start": "1997-09-20T05:00:00+02:00"}},
])
def test_the_edges_of_each_stage_range_are_accepted(raw):
    assert_reads_back(parse_params(raw), raw)


def test_numbers_widen_to_float_but_not_to_int():
    params = parse_params({"train": {"lr": 1, "max_minutes": 2}})
    assert params.train.lr == 1.0 and isinstance(params.train.lr, float)
    assert isinstance(params.train.max_minutes, float)
    with pytest.raises(ConfigError, match=r"train\.epochs: expected an integer, got 3\.0"):
        parse_params({"train": {"epochs": 3.0}})


def test_per_model_train_override():
    params = parse_params({"train": {"epochs": 7, "lr": 0.01, "patience": 4},
                           "sasrec": {"dim": 32, "train": {"epochs": 3, "batch_size": 8}}})
    sasrec = params.train_config("sasrec")
    assert (sasrec.epochs, sasrec.batch_size) == (3, 8)
    assert (sasrec.lr, sasrec.patience) == (0.01, 4)  # the rest is inherited from the global section
    assert params.train_config("mostpop") == params.train == dataclasses.replace(
        TrainConfig(), epochs=7, lr=0.01, patience=4)
    assert params.model_config("sasrec").dim == 32
    assert "train" not in dataclasses.asdict(params.model_config("sasrec"))


def test_model_train_override_must_be_a_mapping():
    with pytest.raises(ConfigError, match="sasrec.train"):
        parse_params({"sasrec": {"train": 3}})


@pytest.mark.parametrize("models, message", [
    (["mostpop", "nosuchmodel"], "nosuchmodel"),
    (["sasrec", "sasrec"], "duplicate"),
    ([], "non-empty"),
    ("sasrec", "non-empty list"),
    ([{"sasrec": None}], re.escape("expected model names, got {'sasrec': None}")),  # `- sasrec:`: a traceback
])
def test_models_list_is_checked(models, message):
    with pytest.raises(ConfigError, match=message):
        parse_params({"models": models})


@pytest.mark.parametrize("raw, message", [
    ({"models": ["sasrec"], "sasrec": {"loss": "bce", "train": {"cuda_graph": True}}},
     "sasrec's 'bce' loss samples negatives"),
    ({"models": ["bert4rec"], "train": {"cuda_graph": True}, "bert4rec": {"loss": "sampled_ce"}},
     "bert4rec's 'sampled_ce' loss samples negatives"),
    ({"models": ["mojito"], "mojito": {"train": {"cuda_graph": True, "micro_batches": 4}}},
     "train.micro_batches is 4; set it to 0 or 1"),
])
def test_cuda_graph_where_the_step_cannot_be_fixed_is_refused_at_load(raw, message):
    """Before any stage runs (it was refused only when the trainer reached the model, minutes in)."""
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        parse_params(raw)
    name = raw["models"][0]
    assert str(err.value).startswith(f"{name}: train.cuda_graph cannot be used: ")
    assert str(err.value).endswith(f"set train.cuda_graph: false for {name} (params.yaml, the model's train: "
                                   "section)")


def test_cuda_graph_is_checked_only_for_the_listed_models_and_with_settings_it_can_take():
    # an unlisted model's section is not run by the pipeline (a bench run is refused by the trainer)
    parse_params({"models": ["mostpop", "sasrec"], "mojito": {"loss": "bce", "train": {"cuda_graph": True}}})
    params = parse_params({"models": ["mostpop", "sasrec", "bert4rec", "mojito"],  # MostPop takes no step
                           "train": {"cuda_graph": True, "micro_batches": 1}})
    assert all(params.train_config(name).cuda_graph for name in params.models)


def test_model_config_of_unknown_name():
    with pytest.raises(ConfigError, match="nosuchmodel"):
        parse_params({}).model_config("nosuchmodel")


def test_params_are_frozen():
    params = parse_params({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.train.epochs = 1  # type: ignore[misc]


def test_load_params_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_params(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {epochs: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_params(listing)


def test_a_relative_params_file_not_found_says_where_it_looked_and_how_to_point_elsewhere(tmp_path,
                                                                                          monkeypatch):
    """Run from a subfolder, every command said only 'params file not found: params.yaml'."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_params(DEFAULT_PARAMS)
    assert str(err.value) == (f"params file not found: {tmp_path / 'params.yaml'} (relative to the current "
                              "folder): run from the repository root or pass --params PATH")


def test_a_params_folder_is_one_line_naming_it_and_the_option(tmp_path):
    """`--params inbox` was an IsADirectoryError traceback (or 'error: [Errno 21] Is a directory')."""
    with pytest.raises(ConfigError) as err:
        read_params(tmp_path)
    assert str(err.value) == (f"params file {tmp_path} is a folder: pass --params PATH naming the "
                              "params.yaml file itself")


def test_an_unreadable_params_file_is_one_line_naming_it_and_the_option(tmp_path, monkeypatch):
    path = tmp_path / "params.yaml"
    path.write_text("models: [mostpop]\n")

    def refuse(self):  # (chmod 000 does not stop root, who may run the tests)
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(type(path), "read_bytes", refuse)
    with pytest.raises(ConfigError) as err:
        load_params(path)
    assert str(err.value) == (f"cannot read params file {path}: Permission denied (--params PATH reads "
                              "another)")


def test_a_params_file_that_is_not_utf8_is_one_line_naming_the_byte_and_its_line(tmp_path):
    """A Latin-1 'é' was a UnicodeDecodeError traceback on every command."""
    path = tmp_path / "params.yaml"
    path.write_bytes("models: [mostpop]\n# caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as err:
        load_params(path)
    assert str(err.value) == (f"params file {path} is not UTF-8 text: byte 0xe9 on line 2; save it as UTF-8 "
                              "(or pass --params PATH)")


@pytest.mark.parametrize("text, where", [
    ("train: {epochs: 3\n", ("line 2, column 1: expected ',' or '}', but got '<stream end>' (while parsing a "
                             "flow mapping from line 1, column 8)")),
    ("train:\n\tepochs: 3\n", "line 2, column 1: found character '\\t' that cannot start any token"),
    ("train: epochs: 3\n", "line 1, column 14: mapping values are not allowed here"),
    # PyYAML kept the last silently while DVC refuses the file: `recsys train` and `dvc repro` disagreed
    ("sasrec:\n  dim: 128\n  dim: 64\n", ("line 3, column 3: key 'dim' appears twice in one mapping (first on "
                                          "line 2): keep one")),
    ("train: {lr: 0.1}\ntrain: {lr: 0.2}\n", ("line 2, column 1: key 'train' appears twice in one mapping (first "
                                              "on line 1): keep one")),
])
def test_invalid_yaml_is_one_line_with_the_line_column_and_problem(tmp_path, text, where):
    """It was pyyaml's 7-line message with its caret diagrams."""
    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_params(path)
    assert str(err.value) == f"{path} is not valid YAML: {where}"


@pytest.mark.parametrize("name", ["sasrec", "bert4rec", "m", "model_2", "a" * 64])
def test_validate_name_accepts(name):
    assert validate_name(name) == name


@pytest.mark.parametrize("name", [
    "x;drop", "sasrec; DROP TABLE models", "Robert'); DROP TABLE students;--", "../etc/passwd", "a/b", "..",
    "sasrec\n", " sasrec", "SASRec", "1model", "_hidden", "", "a" * 65, "mod-el", "m$(id)", "m`id`", None, 3,
])
def test_validate_name_refuses(name):
    with pytest.raises(ConfigError, match="invalid model"):
        validate_name(name, "model name")


def test_a_merge_key_may_be_overridden_without_counting_as_a_duplicate(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("sasrec:\n  <<: {dim: 32, n_layers: 3}\n  dim: 64\n")
    config = load_params(path).model_config("sasrec")
    assert (config.dim, config.n_layers) == (64, 3)


@pytest.mark.parametrize("raw, message", [
    # YAML reads an unquoted `on:` as True: sorting it beside a string key was a TypeError traceback
    ({"train": {True: 1, "epochz": 3}}, "train: unknown key(s) [True, 'epochz']"),
    ({"zzz": 1, 1: 2}, "unknown section(s) [1, 'zzz'] in params.yaml"),
    # a list or a word where a mapping belongs was an AttributeError traceback or a list of its letters
    ({"ingest": {"column_mapping": ["user_id"]}},
     "ingest.column_mapping: expected a mapping of names to names (from: to), got ['user_id']"),
    ({"ingest": {"column_mapping": "user_id"}},
     "ingest.column_mapping: expected a mapping of names to names (from: to), got 'user_id'"),
    ({"ingest": {"column_mapping": {"user_id": 5}}}, "ingest.column_mapping: expected a mapping of names to names"),
    # registry settings are checked when params.yaml is read, not first when a flow opens the registry
    ({"registry": {"model_name": "Next-Item"}},
     ("registry.model_name must be lowercase letters, digits and _ (max 64), starting with a letter, got "
      "'Next-Item'")),
    ({"registry": {"url": " "}}, "registry.url must be a database URL"),
])
def test_malformed_sections_are_one_sentence(raw, message):
    with pytest.raises(ConfigError) as err:
        parse_params(raw)
    assert str(err.value).startswith(message), str(err.value)


def test_yaml_1_1_spellings_read_as_written(tmp_path):
    """Unquoted `off` is false to PyYAML (YAML 1.1) and `1e-3` a string; DVC (YAML 1.2) reads `1e-3` as a
    number. Both were refused ("True is not one of ['auto', 'on', 'off']", "expected a number, got '1e-3'")."""
    path = tmp_path / "params.yaml"
    path.write_text("train:\n  progress: off\n  lr: 1e-3\n  weight_decay: .5E+1\n"
                    "sasrec:\n  train:\n    progress: on\n")
    params = load_params(path)
    assert (params.train.progress, params.train.lr, params.train.weight_decay) == ("off", 0.001, 5.0)
    assert params.train_config("sasrec").progress == "on"
    path.write_text("train:\n  lr: 1e-3x\n")
    with pytest.raises(ConfigError, match=re.escape("train.lr: expected a number, got '1e-3x'")):
        load_params(path)
    path.write_text("train:\n  epochs: 1e3\n")  # an integer setting takes no float spelling
    with pytest.raises(ConfigError, match="train.epochs: expected an integer"):
        load_params(path)


def test_generate_start_is_read_by_the_parser_that_checked_it():
    """An ISO week date passed GenerateConfig's check, then pandas could not parse it (a traceback)."""
    from recsys.data import generate

    week = generate(GenerateConfig(start="2024-W01-1", n_users=20, n_items=10, n_clusters=2, days=5))
    day = generate(GenerateConfig(start="2024-01-01T00:00:00Z", n_users=20, n_items=10, n_clusters=2, days=5))
    assert week.interactions.equals(day.interactions)
