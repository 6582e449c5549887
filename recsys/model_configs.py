"""Each model's hyperparameters — its section of params.yaml — whether it learns from weights, and the
training settings (`train:`, and each model's own `train:` block over it).

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


# The most epochs (and epochs of patience) a run may be given: far beyond any run here (BERT4Rec's ceiling is
# 2,000), and a bound on what a typo (`--epochs 99999999999999999999`) starts.
MAX_EPOCHS = 1_000_000


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
    # Dropout on the attention weights; -1 (the default, what checkpoints saved before the key were trained
    # with) = `dropout`. 0 lets a CPU step use the fused flash-attention kernel instead of the math path that
    # materialises every (query, key) weight and its mask (blocks.py).
    attn_dropout: float = -1.0

    def __post_init__(self) -> None:
        check_transformer(self)
        require(self.attn_dropout == -1.0 or 0.0 <= self.attn_dropout < 1.0, "attn_dropout", self.attn_dropout,
                "in [0, 1), or -1 for `dropout`")
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
# The losses a model computes at one fixed shape (`train.cuda_graph`'s step, recsys/step_graph.py): full
# cross-entropy; a sampled loss draws negatives per target position. The model classes read theirs here.
FIXED_SHAPE_LOSSES: dict[str, frozenset[str]] = {
    "sasrec": frozenset({"ce"}), "bert4rec": frozenset({"ce"}), "mojito": frozenset({"ce"}),
}


def fixed_shape_loss_refusal(name: str, loss: str | None) -> str | None:
    """Why model `name`'s `loss` cannot take a fixed-shape batch, or None when it can."""
    losses = FIXED_SHAPE_LOSSES.get(name, frozenset())
    if loss in losses:
        return None
    if losses:
        return f"{name}'s {loss!r} loss samples negatives per target position; use loss ce"
    return f"{name}'s loss selects its target positions by value (a data-dependent shape)"


def cuda_graph_refusal(name: str, config: Any, train: TrainConfig) -> str | None:
    """`train.cuda_graph`'s refusal of model `name` under these settings — one line naming what to change —
    or None (also when the setting is off, or the model takes no step). Parsing params.yaml checks the listed
    models with it, before any stage runs; the trainer checks every run again (and refuses a data-parallel
    one, known only there)."""
    if not train.cuda_graph or not TRAINABLE.get(name, True):
        return None
    why = fixed_shape_loss_refusal(name, getattr(config, "loss", None))
    if why is None and train.micro_batches > 1:
        why = f"it takes each batch whole, and train.micro_batches is {train.micro_batches}; set it to 0 or 1"
    return None if why is None else cuda_graph_message(name, why)


def cuda_graph_message(name: str, why: str) -> str:
    return (f"{name}: train.cuda_graph cannot be used: {why}; set train.cuda_graph: false for {name} "
            "(params.yaml, the model's train: section)")


# The gate's baseline: evaluated with every retraining, and champion — installed, not gated — until a model
# passes the gate. Only a model that learns by counting may be one (recsys.promotion.check_baseline).
BASELINE = "mostpop"


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


SEED_MAX = 2**32 - 1  # the largest seed numpy's global generator takes (the trainer seeds it)


def check_seed(seed: int, section: str) -> None:
    require(0 <= seed <= SEED_MAX, "seed", seed, f"in [0, {SEED_MAX}] (2**32 - 1)", section)


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 200
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.0
    patience: int = 10
    seed: int = 42
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # Stop after this many minutes even if validation still improves (0 = no limit); the best checkpoint
    # so far is kept, so the run stays honest, just shorter.
    max_minutes: float = 0.0
    grad_clip: float = 5.0
    # Validation targets per scoring batch; 0 = auto: 512 on a CPU, on CUDA as many as fit 2^28 elements of
    # the model's score table (recsys.ranking.scoring_batch_size).
    eval_batch_size: int = 0
    progress: Literal["auto", "on", "off"] = "auto"
    # Learning rate × lr_decay after lr_decay_patience epochs without a new best validation NDCG@10
    # (1.0 = constant learning rate). Early stopping still counts from the last improvement.
    lr_decay: float = 1.0
    lr_decay_patience: int = 5
    # Linear learning-rate warm-up over this many optimiser steps (0 = none).
    warmup_steps: int = 0
    # The rate over a run of `epochs` epochs, set at the start of each epoch: "constant", or decayed from
    # `lr` in epoch 1 towards lr × lr_final after epoch `epochs` along a "cosine" or "linear" curve (a
    # budgeted run: set `epochs` to the budget, and patience to it or more). A pure function of the epoch,
    # so a resumed run continues the same curve; warm-up and lr_decay act on top of it.
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    lr_final: float = 0.0
    # Early stopping may not end a cold run before this epoch (a slow start is not a plateau); a warm start
    # has its own floor, warm_min_epochs.
    min_epochs: int = 0
    # `lr` is the rate at batch size `lr_reference_batch`; another batch size scales it by
    # (batch_size / lr_reference_batch) ** {none: 0, sqrt: 0.5, linear: 1} (large GPU batches).
    lr_scaling: Literal["none", "sqrt", "linear"] = "none"
    lr_reference_batch: int = 128
    # Training sequences per user: "last" = the newest max_len + 1 training events (the SASRec reference);
    # "all" = the whole training history in windows of max_len + 1 events (recsys.sequences.train_spans).
    windows: Literal["last", "all"] = "last"
    # How an epoch's spans form batches: "bucketed" = similar lengths together (least padding: the cheapest
    # epoch on CPU), "random" = uniform batches (every target weighs the same in expectation; issue 11).
    batching: Literal["bucketed", "random"] = "bucketed"
    # Each optimiser step runs as this many length-sorted micro-batches whose gradients add up to the whole
    # batch's (recsys.sequences.micro_batches): the same update with less padding. 0 = auto: 8 on a CPU
    # (a uniform ML-100K epoch 1.9–2.3 × cheaper), 1 on CUDA.
    micro_batches: int = 0
    # Where training starts (recsys/warm.py): "cold" = a fresh initialisation; "warm" = the registry
    # champion's weights (same model family and shapes, or the stage stops and says what differs); "auto" =
    # warm when the champion is compatible, else cold with the reason logged — and cold anyway for every
    # `warm_cold_every`-th version of a warm-started line (0 = never) or when the catalogue grew by more
    # than `warm_max_catalogue_growth` (new items / the champion's items).
    init: Literal["cold", "warm", "auto"] = "cold"
    warm_cold_every: int = 5
    warm_max_catalogue_growth: float = 0.2
    # A warm start's epoch floor: `min_epochs` is for cold starts (a slow start from random weights is not a
    # plateau); a warm start begins near its optimum and the cold floor would make it as long as a cold run.
    warm_min_epochs: int = 0
    # A warm start's patience (0 = `patience`): a model whose cold run climbs after long plateaus (BERT4Rec,
    # patience 80) reaches a warm start's best within a few dozen epochs, and waiting the cold patience out
    # after it only adds time.
    warm_patience: int = 0
    # Share of the champion's weights a warm start keeps: every carried-over tensor becomes
    # warm_keep × champion + (1 − warm_keep) × this run's fresh initialisation ("shrink and perturb", Ash &
    # Adams 2020, with the perturbation drawn from the model's own initialiser). 1 = the champion as it is.
    warm_keep: float = 1.0
    # Train at one fixed shape (full-width batches of batch_size rows, padding masked in the loss) and, on
    # CUDA, capture the step once as a CUDA graph and replay it: the step no longer waits for the host
    # (recsys/step_graph.py). Models with loss ce; one process; micro_batches 0 or 1. On a CPU the same step
    # runs eagerly, at full width (slower than micro-batches there).
    cuda_graph: bool = False
    # Exponential moving average of the weights, updated after every optimiser step with this decay (0 =
    # off; 0.99 averages over roughly the last 100 steps). Validation, the best checkpoint and so the test
    # score the averaged weights; the optimiser keeps stepping the raw ones.
    ema: float = 0.0
    # With ema: the decay at optimiser step t (from 1) is min(ema, (1 + t) / (10 + t)) (TensorFlow's
    # ExponentialMovingAverage with num_updates), so the average follows the weights while they move fast and
    # reaches ema itself after (10·ema − 1) / (1 − ema) steps (8,990 for 0.999). Without it the average starts
    # at the initial weights and lags them by ~1 / (1 − ema) steps (0.999: ~110 epochs of ML-100K's BERT4Rec).
    ema_warmup: bool = False
    # How the process's C allocator treats the tensors a CPU step frees (glibc on Linux; elsewhere nothing
    # changes): "retain" keeps freed memory in the process for the next step instead of handing every large
    # block back to the kernel and faulting it in again (recsys.device.retain_cpu_memory; ML-100K SASRec:
    # validation 39 % and the whole run 11 % faster, benchmarks/RESULTS.md); "system" leaves the C library's
    # defaults. The trainer and the evaluate stage (its test pass) apply it. Speed only: the same numbers
    # either way.
    cpu_allocator: Literal["retain", "system"] = "retain"
    # The training step's arithmetic (forward and loss; weights, gradients, Adam and the moving average stay
    # float32, and validation, test and serving always score in float32, where bfloat16's 8-bit mantissa would
    # tie scores): "bf16" runs the step under bfloat16 autocast (matrix products in bfloat16; the attention
    # softmax and the loss's log-sum-exp in float32); "fp32" in float32; "auto" is bf16 on CUDA with bf16
    # support, fp32 on a CPU (recsys.device.training_autocast). On a CPU with AVX512-BF16 or AMX, bf16 cuts a
    # SASRec step's CPU time 1.86 x, MOJITO's 1.27 x, BERT4Rec's not at all at 8 micro-batches (this
    # project's AMD EPYC); it is asked for by name there until its quality is measured over seeds
    # (benchmarks/RESULTS.md, session 43).
    precision: Literal["auto", "bf16", "fp32"] = "auto"

    @property
    def effective_lr(self) -> float:
        power = {"none": 0.0, "sqrt": 0.5, "linear": 1.0}[self.lr_scaling]
        return self.lr * (self.batch_size / self.lr_reference_batch) ** power

    def schedule_factor(self, epoch: int) -> float:
        """`lr_schedule`'s share of the rate in `epoch` (1-based): lr_final + (1 − lr_final)·f(t), t = (epoch −
        1) / epochs, f falling from 1 at t = 0 to 0 at t = 1 — reached after the last epoch, so none trains at
        lr_final itself (PyTorch's CosineAnnealingLR with T_max = epochs, stepped once an epoch). 1 for
        "constant"."""
        if self.lr_schedule == "constant":
            return 1.0
        t = min(max(epoch - 1, 0) / self.epochs, 1.0)
        f = 0.5 * (1.0 + math.cos(math.pi * t)) if self.lr_schedule == "cosine" else 1.0 - t
        return self.lr_final + (1.0 - self.lr_final) * f

    def __post_init__(self) -> None:
        for name in ("epochs", "patience"):
            require(1 <= getattr(self, name) <= MAX_EPOCHS, name, getattr(self, name),
                    f"from 1 to {MAX_EPOCHS:,} (whole epochs)", "train")
        for name in ("lr", "max_minutes", "grad_clip", "weight_decay"):
            zero = {"lr": "the weights stay as initialised", "max_minutes": "no time limit",
                    "grad_clip": "no clipping", "weight_decay": "none"}[name]
            value = getattr(self, name)
            require(0.0 <= value < math.inf, name, value, f"a finite number >= 0 (0 = {zero})", "train")
        require(0.0 < self.lr_decay <= 1.0, "lr_decay", self.lr_decay, "in (0, 1]", "train")
        require(0.0 <= self.lr_final <= 1.0, "lr_final", self.lr_final, "in [0, 1] (the share of train.lr "
                "that lr_schedule decays to by the end of the last epoch)", "train")
        check_sizes(self, "lr_decay_patience", "batch_size", "lr_reference_batch", section="train")
        for name in ("warmup_steps", "min_epochs", "warm_min_epochs", "micro_batches", "eval_batch_size"):
            require(getattr(self, name) >= 0, name, getattr(self, name), ">= 0", "train")
        require(0 <= self.warm_patience <= MAX_EPOCHS, "warm_patience", self.warm_patience,
                f"from 0 to {MAX_EPOCHS:,} (whole epochs; 0 = patience)", "train")
        require(self.warm_cold_every >= 0, "warm_cold_every", self.warm_cold_every,
                ">= 0 (0 = never forced cold)", "train")
        growth = self.warm_max_catalogue_growth
        require(growth >= 0.0, "warm_max_catalogue_growth", growth, ">= 0", "train")
        require(0.0 < self.warm_keep <= 1.0, "warm_keep", self.warm_keep, "in (0, 1] (1 = the champion's "
                "weights as they are; a smaller share blends in a fresh initialisation)", "train")
        require(0.0 <= self.ema < 1.0, "ema", self.ema, "in [0, 1) (0 = off; the decay of the weights' "
                "moving average per optimiser step)", "train")
        check_seed(self.seed, "train")
