"""Model registry: every model is selectable by name in params.yaml and built by `build_model`."""

from __future__ import annotations

import dataclasses
from typing import Any

from recsys.model_configs import MODEL_CONFIGS, RETIRED_KEYS, retired_value
from recsys.models.base import Batch, SequentialModel
from recsys.models.bert4rec import BERT4Rec
from recsys.models.mojito import Mojito
from recsys.models.mostpop import MostPop
from recsys.models.sasrec import SASRec

# The same names as recsys.model_configs.MODEL_CONFIGS (what params.yaml may list; parsed without torch).
MODELS: dict[str, type[SequentialModel]] = {
    "mostpop": MostPop,
    "sasrec": SASRec,
    "bert4rec": BERT4Rec,
    "mojito": Mojito,
}


def build_model(name: str, config: Any, n_items: int, n_users: int) -> SequentialModel:
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; available: {sorted(MODELS)}")
    return MODELS[name](config, n_items=n_items, n_users=n_users)


def check_fits(name: str, config: Any, n_items: int, n_users: int, device: Any) -> None:
    """Refuse (`recsys.device.DeviceError`, one line naming the sizes to lower) a model whose parameters
    cannot be trained on `device` at all, counted on the meta device: nothing is allocated to find out."""
    import torch

    from recsys.device import check_parameters_fit

    with torch.device("meta"):
        n = sum(p.numel() for p in build_model(name, config, n_items=n_items, n_users=n_users).parameters())
    sizes = {k: getattr(config, k) for k in ("dim", "ffn_dim", "n_layers", "max_len") if hasattr(config, k)}
    what = f"{name} ({', '.join(f'{k} {v:,}' for k, v in sizes.items())}; {n_items:,} items, {n_users:,} users)"
    lower = " or ".join(f"{name}.{k} (now {v:,})" for k, v in sizes.items() if k != "max_len")
    check_parameters_fit(n, device, what, f"lower {lower or 'the catalogue'}, or train on a device with more "
                                          "memory (train.device)")


def config_from_dict(name: str, raw: dict[str, Any]) -> Any:
    """A model config from a checkpoint's JSON. Keys retired since it was saved (recsys.model_configs
    RETIRED_KEYS) are dropped; a retired value it depends on (a model trained with a removed loss) is refused
    with the reason."""
    if retired := retired_value(name, raw):
        key, value, why = retired
        raise ValueError(f"{name}: this checkpoint was trained with {key}={value!r}, which no longer exists "
                         f"({why}); train the model again")
    raw = {k: v for k, v in raw.items() if k not in RETIRED_KEYS.get(name, {})}
    cls = MODEL_CONFIGS[name]
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"{name}: unknown config key(s) {sorted(unknown)}")
    return cls(**raw)


__all__ = ["Batch", "SequentialModel", "MODELS", "MODEL_CONFIGS", "build_model", "check_fits",
           "config_from_dict"]
