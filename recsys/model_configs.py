"""Each model's hyperparameters — its section of params.yaml — and whether it learns from weights.

Importable without PyTorch, on purpose: every flow run, `recsys` command and stage parses params.yaml, and a
run that builds no model (a scheduled run when nothing new arrived) must not pay seconds to load torch for
it. The networks stay one file per model in `recsys/models/` and take their config from here;
`recsys.models.MODELS` lists exactly these names (tests/test_models.py checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

# A transformer block's residual arrangement (recsys/models/blocks.py): "reference" is the SASRec reference
# code's (the residual adds the layer-normalised input), "pre_ln" is x + f(LN(x)).
RESIDUALS = ("reference", "pre_ln")


def check_residual(residual: str) -> None:
    if residual not in RESIDUALS:
        raise ValueError(f"residual must be {' or '.join(map(repr, RESIDUALS))}, got {residual!r}")


class SettingError(ValueError):
    """A setting out of its valid range, raised by a config's own checks. `key` is relative to the config
    (`dropout`, `lr`) so that parsing names the whole dotted key where the setting was written
    (`sasrec.dropout`, `sasrec.train.lr`; recsys.config.build_dataclass); `section` prefixes it when the
    config is built directly."""

    def __init__(self, key: str, problem: str, section: str = "") -> None:
        super().__init__(f"{section}.{key} {problem}" if section else f"{key} {problem}")
        self.key, self.problem = key, problem


def require(ok: bool, key: str, value: Any, valid: str, section: str = "") -> None:
    """Refuse `value` of `key` unless `ok`: '<key> must be <valid>, got <value>'. Write `ok` as a comparison
    that NaN fails (`0.0 <= x < 1.0`, not `not x >= 1.0`)."""
    if not ok:
        raise SettingError(key, f"must be {valid}, got {value!r}", section)


def check_sizes(config: Any, *keys: str, section: str = "") -> None:
    """Every one of `keys` a whole number >= 1 (a width, a count, a length)."""
    for key in keys:
        value = getattr(config, key)
        require(value >= 1, key, value, ">= 1", section)


def check_transformer(config: Any, streams: int = 1) -> None:
    """The fields every transformer model shares (`dim`, `n_layers`, `n_heads`, `dropout`, `max_len`); the
    attention splits `streams` × dim (MOJITO's items and contexts: 2) into `n_heads` heads."""
    check_sizes(config, "dim", "n_layers", "n_heads", "max_len")
    width, name = streams * config.dim, "dim" if streams == 1 else f"{streams}*dim"
    require(width % config.n_heads == 0, "n_heads", config.n_heads, f"a divisor of {name} ({width})")
    require(0.0 <= config.dropout < 1.0, "dropout", config.dropout, "in [0, 1)")


@dataclass(frozen=True)
class MostPopConfig:
    pass


@dataclass(frozen=True)
class SASRecConfig:
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 2
    dropout: float = 0.2
    max_len: int = 200
    loss: Literal["ce", "bce", "sampled_ce"] = "ce"
    n_negatives: int = 256
    residual: Literal["reference", "pre_ln"] = "reference"
    weight_init: Literal["normal", "xavier"] = "normal"
    emb_scale: bool = True  # item embeddings × √dim at the input
    # Dropout on the item embedding table itself while training: one dropped table per step serves both the
    # input lookup and the output softmax (RecTools' item net), a regulariser of the output layer too.
    item_dropout: float = 0.0

    def __post_init__(self) -> None:
        check_transformer(self)
        if self.loss == "sampled_ce":  # (read by no other loss: a checkpoint that set it unused still loads)
            check_sizes(self, "n_negatives")
        check_residual(self.residual)
        require(0.0 <= self.item_dropout < 1.0, "item_dropout", self.item_dropout, "in [0, 1)")
        if self.weight_init not in ("normal", "xavier"):
            raise ValueError(f"weight_init must be 'normal' or 'xavier', got {self.weight_init!r}")


@dataclass(frozen=True)
class BERT4RecConfig:
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 2
    dropout: float = 0.1
    max_len: int = 200
    ffn_dim: int = 256
    mask_prob: float = 0.2
    # Share of each batch's rows that get only their last item masked (the test-time task).
    last_item_share: float = 0.1
    loss: Literal["ce", "sampled_ce"] = "ce"
    n_negatives: int = 256
    # "pre_ln": x + f(LN(x)); "reference": the SASRec reference code's arrangement (blocks.py).
    # These two defaults stay what checkpoints saved before the keys existed were trained with
    # (config_from_dict fills a missing key from here); params.yaml trains reference + head_norm.
    residual: Literal["pre_ln", "reference"] = "pre_ln"
    head_norm: bool = False  # Sun et al.'s output transform: LayerNorm(GELU(h W + b)) before Eᵀ
    # How many tokens a random-mask row masks: "bernoulli", each with probability mask_prob (anything from 1
    # to n); "exact", round(mask_prob·n) of them (at least 1), as the reference code's cloze samples — a
    # bound the fixed-shape step's loss can be cut to (train.cuda_graph: loss rows ≈ mask_prob × tokens).
    masking: Literal["bernoulli", "exact"] = "bernoulli"

    def __post_init__(self) -> None:
        check_transformer(self)
        check_sizes(self, "ffn_dim", *(["n_negatives"] if self.loss == "sampled_ce" else []))  # (as SASRec's)
        check_residual(self.residual)
        if self.masking not in ("bernoulli", "exact"):
            raise ValueError(f"masking must be 'bernoulli' or 'exact', got {self.masking!r}")
        require(0.0 < self.mask_prob <= 1.0, "mask_prob", self.mask_prob, "in (0, 1]")
        require(0.0 <= self.last_item_share <= 1.0, "last_item_share", self.last_item_share, "in [0, 1]")


@dataclass(frozen=True)
class MojitoConfig:
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 2
    dropout: float = 0.2
    max_len: int = 200
    # Time context: per-feature Mercer encoding width, harmonics, and log10 range of initial periods.
    time_dim: int = 16
    time_expand: int = 3
    time_linspace: float = 8.0
    base_year: int = 2000  # the year feature is year - base_year + 1
    noise_init: float = 0.1  # initial σ of the attention-score noise
    # Long-term attentive FISM.
    long_weight: float = 0.1  # λ in short + λ·long; 0 disables the long-term part
    fism_items: int = 20
    fism_attention: float = 0.5  # β: share of the attentive vector in w = (1 - β) + β·a
    loss: Literal["ce", "bce"] = "ce"
    # "reference": the TF code's residuals (add the layer-normalised input); "pre_ln": x + f(LN(x)).
    residual: Literal["pre_ln", "reference"] = "pre_ln"

    def __post_init__(self) -> None:
        check_transformer(self, streams=2)
        check_sizes(self, "time_dim", "time_expand", "fism_items")
        check_residual(self.residual)
        require(math.isfinite(self.time_linspace), "time_linspace", self.time_linspace, "a finite number")
        # σ is a standard deviation and λ a weight (0 turns the long-term part off): neither has a sign
        for key in ("noise_init", "long_weight"):
            value = getattr(self, key)
            require(0.0 <= value < math.inf, key, value, "a finite number >= 0")
        require(0.0 <= self.fism_attention <= 1.0, "fism_attention", self.fism_attention, "in [0, 1]")


MODEL_CONFIGS: dict[str, type] = {
    "mostpop": MostPopConfig,
    "sasrec": SASRecConfig,
    "bert4rec": BERT4RecConfig,
    "mojito": MojitoConfig,
}
# False for a model that learns only by counting (MostPop): the trainer takes no gradient step and there are
# no weights to warm-start from. The model classes read their `trainable` flag from here.
TRAINABLE: dict[str, bool] = {"mostpop": False, "sasrec": True, "bert4rec": True, "mojito": True}


# What a model's config no longer has, and why (one home: params.yaml parsing and checkpoint loading both
# read it). A params.yaml that sets a retired key or value stops with the reason; a checkpoint saved before
# the removal still loads when the retired key had no effect on it (gbce_t of a model not trained with gBCE).
GBCE_REMOVED = ("SASRec's gBCE loss was removed (measured: 0.0695 test NDCG@10 against full CE's 0.1089 on "
                "ml-100k, same settings and seed, 0.64 x; benchmarks/RESULTS.md); use loss ce (the default), "
                "or sampled_ce for a sampled loss")
RETIRED_KEYS: dict[str, dict[str, str]] = {"sasrec": {"gbce_t": GBCE_REMOVED}}
RETIRED_VALUES: dict[str, dict[tuple[str, object], str]] = {"sasrec": {("loss", "gbce"): GBCE_REMOVED}}


def retired_value(model: str, raw: dict) -> tuple[str, object, str] | None:
    """(key, value, why) of the first retired value `raw` (a model's config mapping) sets, else None."""
    for (key, value), why in RETIRED_VALUES.get(model, {}).items():
        if raw.get(key) == value:
            return key, value, why
    return None
