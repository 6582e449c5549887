"""Would validation NDCG@10 alone have chosen params.yaml's ablation-justified defaults?

    python benchmarks/valid_vs_test.py        # prints the Markdown table and its summary

Read-only: reads benchmarks/results/models.json (CPU rows) and models-gpu.json (GPU rows), writes
nothing. Each comparison below names the two run strings (as stored in the rows), the file, the dataset and what
the default is. Following benchmarks/curves.py, a figure is a mean over the seeds the two runs SHARE (a seed's
luck is not counted as an effect); "sd" is the sample sd over those seeds on each side.

The settings each side trained are read from the rows' own `config` / `train` (a run string is read against
params.yaml as it was on the day, so the string alone does not say what trained; RESULTS.md, session 21). The
"stored configs differ in" note lists every difference between the two sides' stored settings, so that a
comparison that changes more than its label says is visible. A key a row lacks is a feature that did not exist
yet when the row trained: it is read as the behaviour of the code before the key (BEFORE_THE_KEY, from
benchmarks/RESULTS.md and curves.py's descriptions of those rows) before comparing.

Verdict rule ("validation agrees?" = does validation NDCG@10 favour the value params.yaml chose):
  * n >= 2 seeds a side: |mean_chosen - mean_alt| <= max(sd_chosen, sd_alt) -> "tie within 1 sd" (with the
    side it leans to and on how many seeds the chosen side is higher); else "yes" (chosen higher) / "no".
  * 1 seed a side: the sign only, marked "1 seed" (no sd to judge a tie by).
The same rule applied to test NDCG@10 is shown beside it ("test says"), for the claim as params.yaml makes it.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import curves  # the run strings and the results files
from results_md import mean_sd, row_seed

FILES = {"CPU": curves.RESULTS, "GPU": curves.GPU_RESULTS}

# Settings that say where/how a row ran, not what it learned (bench_models._RERUN_FREE and the seed).
IGNORED = {"seed", "device", "max_minutes", "progress", "eval_batch_size", "cpu_allocator"}
# Settings that change how a step is executed, not the model or the objective: micro-batches take the same
# gradient (RESULTS.md session 7: only the dropout draws differ); a CUDA graph replays the same fixed-shape step.
EXECUTION = {"t.micro_batches", "t.cuda_graph"}
# A key a row lacks = the feature did not exist when it trained; the code then behaved as this value.
BEFORE_THE_KEY = {
    "t.cuda_graph": False, "t.ema": 0.0, "t.ema_warmup": False, "t.lr_schedule": "constant", "t.lr_final": 0.0,
    "t.warm_keep": 1.0, "t.warm_min_epochs": 0, "t.warm_patience": 0, "t.init": "cold", "t.warm_cold_every": 5,
    "t.warm_max_catalogue_growth": 0.2, "t.lr_decay": 1.0, "t.lr_decay_patience": 5, "t.lr_scaling": "none",
    "t.lr_reference_batch": 128, "t.warmup_steps": 0,
    "t.precision": "auto",        # what ran before the key: bf16 autocast on CUDA, float32 on a CPU
    "t.min_epochs": 0,            # no epoch floor
    "t.windows": "last",          # each user's newest max_len+1 events (RESULTS.md: the reference code's)
    "t.batching": "bucketed",     # the trainer's length-bucketed batches (RESULTS.md session 6)
    "t.micro_batches": "whole batches",
    "c.item_dropout": 0.0, "c.weight_init": "normal", "c.emb_scale": True, "c.gbce_t": 0.75,
    "c.residual": "pre_ln",       # the only block before session 4's `residual` setting
    "c.head_norm": False,         # no LayerNorm after the head's GELU before session 12
    "c.masking": "bernoulli",     # exact masking arrived in session 24
    "c.attn_dropout": -1.0,       # the attention weights took `dropout` before session 46's key
}

CHOSEN_AT = "chosen"

# Run strings: benchmarks/curves.py's constants (one spelling of each run), under short names for the table.
REF, R2, WALL, MIN100 = curves.REF, curves._R2, curves._WINDOWS_ALL, curves._MIN100
R1 = "sasrec:ce@residual=reference,n_heads=1"  # (curves.py names no constant for it)
SASREC_D64, SASREC_DEFAULT, SASREC_P40 = curves.SASREC_D64, curves.SASREC_DEFAULT_RUN, curves.SASREC_P40
B_LONG, B_P40, B_REF, B_HN = curves.BERT4REC_LONG, curves.BERT4REC_P40, curves.BERT4REC_REF, curves.BERT4REC_REF_HN
B_LIS, B_DEFAULT, B_EXACT = curves.BERT4REC_LIS01, curves.BERT4REC_EMA_WARMUP, curves.BERT4REC_EXACT
B_G = curves.BERT4REC_GRAPHED
M_LONG, M_LR2, M_WIDE = curves.MOJITO_LONG, curves.MOJITO_LR2, curves.MOJITO_WIDE

# (params.yaml setting = chosen value, alternative, file, dataset, chosen run, alternative run, note)
# Ordered as params.yaml; each is either cited with numbers in a params.yaml comment or a decision the
# RESULTS.md ablation section (its "Conclusions" and session notes) states.
COMPARISONS = [
    # --- SASRec -----------------------------------------------------------------------------------------
    ("sasrec.dim = 128 with sasrec.train.lr = 0.002", "dim 64, lr 0.001", "GPU", "ml-1m-half",
     SASREC_DEFAULT, SASREC_D64, "params.yaml: \"+0.008 test NDCG@10 on ML-1M-half (3 GPU seeds)\""),
    ("sasrec.dim = 128 with sasrec.train.lr = 0.002", "dim 64, lr 0.001", "CPU", "ml-1m-half",
     SASREC_DEFAULT, SASREC_D64, "RESULTS ablation: +0.0065"),
    ("sasrec.dim = 128 with sasrec.train.lr = 0.002", "dim 64, lr 0.001", "CPU", "ml-100k",
     SASREC_DEFAULT, SASREC_D64, "params.yaml: \"level on ML-100K\" (chosen side has 5 seeds, 3 shared)"),
    ("sasrec.dim = 128 (lr 0.001 both sides)", "dim 64", "GPU", "ml-1m-half",
     f"{SASREC_D64},dim=128", SASREC_D64, "width alone"),
    ("sasrec.train.lr = 0.002 (dim 128 both sides)", "lr 0.001", "GPU", "ml-1m-half",
     SASREC_DEFAULT, f"{SASREC_D64},dim=128", "params.yaml: \"with dim 128 (1e-3 with dim 64)\"; rate alone"),
    ("sasrec.dim = 128 (RESULTS \"Capacity\", session 4; lr 0.001, bucketed batches)", "dim 64", "CPU",
     "ml-100k", f"{WALL},dim=128", WALL, "RESULTS: \"dim 128 +0.0110 on seed 42\""),
    ("sasrec.dim = 128 (session 4, epoch floor 100, lr 0.001, bucketed)", "dim 64", "CPU", "ml-100k",
     f"{WALL},dim=128,min_epochs=100", MIN100,
     "same-floor pair (RESULTS' table sets this run against the no-floor run instead)"),
    ("sasrec.residual = reference", "pre_ln", "CPU", "ml-100k", R1, "sasrec:ce",
     "RESULTS: kept \"because validation prefers it\" (test prefers pre_ln)"),
    ("sasrec.n_heads = 2 (with patience 20)", "1 head, patience 10", "CPU", "ml-100k", R2, R1,
     "RESULTS: +0.0012"),
    ("sasrec.item_dropout = 0.0", "0.2", "CPU", "ml-100k", R2, f"{REF},item_dropout=0.2",
     "params.yaml: \"0.2 hurt on ML-100K\""),
    ("sasrec.weight_init = normal, emb_scale = true", "xavier, no √d scale", "CPU", "ml-100k", MIN100,
     f"{MIN100},weight_init=xavier,emb_scale=false", "RESULTS: \"worse on the split that selects\""),
    ("sasrec.loss = ce", "gbce (t 0.75)", "CPU", "ml-100k", SASREC_D64,
     f"sasrec:gbce@{SASREC_D64.partition('@')[2]}", "params.yaml: \"gBCE was removed: 0.64 × ce\""),
    ("sasrec.train.windows = all", "last", "CPU", "ml-100k", WALL, R2,
     "RESULTS: \"the largest single gain\" (+0.0157, seed 42)"),
    ("sasrec.train.min_epochs = 100", "0", "CPU", "ml-100k", MIN100, WALL, "RESULTS: +0.0110, 3 seeds"),
    ("sasrec.train.batching = random", "bucketed", "CPU", "ml-100k", SASREC_D64, MIN100,
     "params.yaml: \"+0.013 test NDCG@10 on ML-100K\""),
    ("sasrec.train.patience = 20", "40", "CPU", "ml-100k", SASREC_D64, SASREC_P40,
     ("RESULTS (session 11): \"none is established, the defaults stay\"; curves.py labels the alternative "
     "\"patience 40 and no epoch floor\", but its stored train.min_epochs is 100, as the default's")),
    ("sasrec.dropout = 0.2", "0.1", "CPU", "ml-100k", SASREC_D64, f"{SASREC_D64},dropout=0.1",
     "RESULTS (session 11)"),
    ("sasrec.dropout = 0.2", "0.3", "CPU", "ml-100k", SASREC_D64, f"{SASREC_D64},dropout=0.3",
     "RESULTS (session 11)"),
    ("train.weight_decay = 0.0 (SASRec)", "1e-4", "CPU", "ml-100k", SASREC_D64,
     f"{SASREC_D64},weight_decay=0.0001", "RESULTS (session 11)"),
    ("train.warmup_steps = 0 (SASRec)", "100", "CPU", "ml-100k", SASREC_D64, f"{SASREC_D64},warmup_steps=100",
     "RESULTS (session 11)"),
    ("train.ema = 0.0 (SASRec)", "0.99", "CPU", "ml-100k", SASREC_D64, f"{SASREC_D64},ema=0.99",
     "RESULTS ablation (session 18)"),
    # --- the global train section -------------------------------------------------------------------------
    ("train.lr_decay = 1.0", "0.5 (patience 5)", "CPU", "ml-100k", "bert4rec",
     "bert4rec@lr_decay=0.5,lr_decay_patience=5", "params.yaml: \"0.5 hurt BERT4Rec\""),
    # --- BERT4Rec -----------------------------------------------------------------------------------------
    ("bert4rec.train: windows all, min_epochs 200, patience 40, grad_clip 0; dropout 0.2",
     "windows last, min_epochs 0, patience 20, grad_clip 5; dropout 0.1", "CPU", "ml-100k", B_LONG,
     "bert4rec@batching=random", "params.yaml: \"0.1 → 0.2 with the whole history (session 9)\"; a bundle"),
    ("bert4rec.train.min_epochs = 200", "0", "CPU", "ml-100k", B_LONG, B_P40, "session 9 probe"),
    ("bert4rec.train.batching = random", "bucketed", "CPU", "ml-100k", "bert4rec@batching=random", "bert4rec",
     "params.yaml cites 0.0771 ± 0.0046 (seeds 42–44) vs 0.0704 (seed 42): not the same seeds"),
    ("bert4rec.residual = reference", "pre_ln", "CPU", "ml-100k", B_REF, B_LONG, "RESULTS ablation"),
    ("bert4rec.head_norm = true", "false", "CPU", "ml-100k", B_HN, B_REF, "RESULTS ablation"),
    ("bert4rec.dropout = 0.2", "0.3", "CPU", "ml-100k", B_HN, B_HN.replace("dropout=0.2", "dropout=0.3"),
     ("params.yaml: \"0.3 hurt (0.0907 vs 0.1050, seed 42)\"; 0.1050 is the last_item_share 0.1 run's seed 42, "
     "not this base's")),
    ("bert4rec.mask_prob = 0.3", "0.2", "CPU", "ml-100k", B_HN, f"{B_HN},mask_prob=0.2",
     "params.yaml: \"0.0798 vs 0.0997 on ML-100K (seed 42)\""),
    ("bert4rec.mask_prob = 0.3", "0.45", "CPU", "ml-100k", B_HN, f"{B_HN},mask_prob=0.45",
     "params.yaml: \"0.45: 0.0975\""),
    ("bert4rec.mask_prob = 0.3", "0.2", "GPU", "ml-1m-half", B_LIS, f"{B_G},mask_prob=0.2",
     "RESULTS session 28: \"below the defaults: dropped\"; alternative graphed"),
    ("bert4rec.mask_prob = 0.3", "0.4", "GPU", "ml-1m-half", B_LIS, f"{B_G},mask_prob=0.4",
     "GPU candidate row (curves.py BERT4REC_MASK04_GRAPHED); alternative graphed"),
    ("bert4rec.mask_prob = 0.3 (with ema 0.999)", "0.4 (with ema 0.999)", "GPU", "ml-1m-half",
     f"{B_G},ema=0.999", f"{B_G},mask_prob=0.4,ema=0.999", "GPU candidate rows (session 32); both graphed"),
    ("bert4rec.mask_prob = 0.3 (exact masking)", "0.4 (exact masking)", "CPU", "ml-100k", B_EXACT,
     f"{B_EXACT},mask_prob=0.4", "RESULTS ablation (session 24)"),
    ("bert4rec.last_item_share = 0.1", "0.25", "CPU", "ml-100k", B_LIS, B_HN,
     "params.yaml: \"0.1 beat 0.25 and 0.5\""),
    ("bert4rec.last_item_share = 0.1", "0.5", "CPU", "ml-100k", B_LIS, f"{B_HN},last_item_share=0.5",
     "params.yaml: \"0.1 beat 0.25 and 0.5\""),
    ("bert4rec.last_item_share = 0.1", "0.05", "CPU", "ml-100k", B_LIS, f"{B_HN},last_item_share=0.05",
     "RESULTS ablation (session 18)"),
    ("bert4rec.masking = bernoulli", "exact", "CPU", "ml-100k", B_LIS, B_EXACT,
     "params.yaml: \"the same on ML-100K\""),
    ("bert4rec.masking = bernoulli", "exact", "CPU", "ml-1m-half", B_LIS, B_EXACT,
     "params.yaml: \"below on ML-1M-half\""),
    ("bert4rec.train.ema = 0.999, ema_warmup = true", "ema off", "CPU", "ml-100k", B_DEFAULT, B_LIS,
     "params.yaml: \"ML-100K 0.1082 ± 0.0013 vs 0.1039 ± 0.0015 off\""),
    ("bert4rec.train.ema = 0.999, ema_warmup = true", "ema off", "CPU", "ml-1m-half", B_DEFAULT, B_LIS,
     "RESULTS ablation: +0.0058"),
    ("bert4rec.train.ema = 0.999 (no warm-up, graphed)", "ema off (eager)", "GPU", "ml-1m-half",
     f"{B_G},ema=0.999", B_LIS, ("params.yaml: \"ML-1M-half (GPU, without the warm-up) 0.1724 ± 0.0032 vs "
     "0.1673 ± 0.0021\"")),
    ("bert4rec.train.ema = 0.999 (no warm-up, graphed)", "0.9995 (graphed)", "GPU", "ml-1m-half",
     f"{B_G},ema=0.999", f"{B_G},ema=0.9995", "GPU candidate rows (session 32)"),
    ("bert4rec.dim = 64 (ffn 256, lr 3e-3)", "dim 128 (ffn 512, lr 2e-3)", "CPU", "ml-100k", B_LIS,
     f"{B_LIS},dim=128,ffn_dim=512,lr=0.002", "RESULTS session 20–21: defaults stay at dim 64"),
    ("bert4rec.dim = 64 (ffn 256, lr 3e-3)", "dim 128 (ffn 512, lr 2e-3)", "GPU", "ml-1m-half", B_LIS,
     f"{B_LIS},dim=128,ffn_dim=512,lr=0.002", "RESULTS session 28: \"0.1677, level\""),
    ("bert4rec.train.patience = 40", "80", "CPU", "ml-1m-half", B_DEFAULT,
     B_DEFAULT.replace("patience=40", "patience=80"),
     "session 37; the patience-80 row was stopped by the clock (not converged)"),
    ("bert4rec.attn_dropout = -1 (= dropout, 0.2)", "0 (the fused attention kernel on a CPU)", "CPU", "ml-100k",
     B_DEFAULT, curves.BERT4REC_100K_AD0, "session 46: kept on ML-100K; ML-1M-half in RESULTS"),
    ("bert4rec.attn_dropout = 0, train: a budget of 400 epochs (patience 80 after epoch 200)",
     "attn_dropout -1, min_epochs 200, patience 40, epochs 2000", "CPU", "ml-100k", curves.BERT4REC_AD0_E400,
     B_DEFAULT, "session 51: params.yaml's BERT4Rec since then (curves.BERT4REC_DEFAULT_RUN)"),
    ("bert4rec.attn_dropout = 0, train: a budget of 400 epochs (patience 80 after epoch 200)",
     "attn_dropout -1, min_epochs 200, patience 40, epochs 2000", "CPU", "ml-1m-half", curves.BERT4REC_AD0_E400,
     B_DEFAULT, "session 51 (chosen: Intel Xeon rows, alternative: AMD EPYC; validation does not depend on the box)"),
    # --- MOJITO -------------------------------------------------------------------------------------------
    ("mojito.train: windows all, patience 20, min_epochs 100 (uniform batches both)",
     "windows last, patience 10, min_epochs 0", "CPU", "ml-100k", M_LONG, "mojito@batching=random",
     "params.yaml: \"0.1208 / 0.1197 (seeds 42, 43) against 0.1118 / 0.0972\""),
    ("mojito.train.batching = random", "bucketed", "CPU", "ml-100k", "mojito@batching=random", "mojito",
     "params.yaml: SASRec's regime (session 10)"),
    ("mojito.train.lr = 0.002", "0.001", "CPU", "ml-100k", M_LR2, M_LONG,
     "params.yaml: \"the same NDCG@10 (0.1185 vs 0.1186, 3 seeds) in 0.4 × the CPU time\""),
    ("mojito.train.lr = 0.002", "0.001", "CPU", "ml-1m-half", M_LR2, M_LONG, "RESULTS session 28: +0.0053"),
    ("mojito.train.lr = 0.002 (graphed both)", "0.001 (graphed)", "GPU", "ml-1m-half", f"{M_LR2},cuda_graph=true",
     f"{M_LONG},cuda_graph=true", "RESULTS session 29: GPU seed 42 −0.0052 (alternative ran alone)"),
    ("mojito.dim = 64 (lr 2e-3 both)", "128", "CPU", "ml-100k", M_LR2, M_WIDE, "same rate both sides"),
    ("mojito.dim = 64 (lr 2e-3 both, graphed)", "128 (graphed)", "GPU", "ml-1m-half",
     f"{M_LR2},cuda_graph=true", f"{M_WIDE},cuda_graph=true", "same rate both sides"),
    ("mojito.dim = 64 (session 28 decision: dim 64 lr 1e-3, eager)", "dim 128, lr 2e-3, graphed", "GPU",
     "ml-1m-half", M_LONG, f"{M_WIDE},cuda_graph=true",
     "RESULTS session 28: \"0.2008 ± 0.0002 … the wide setting 0.1977 ± 0.0039\": the default keeps the quality"),
    ("mojito.dim = 64 (session 28 decision: lr 1e-3 then)", "dim 128, lr 2e-3", "CPU", "ml-100k", M_LONG,
     M_WIDE, "RESULTS session 28: \"0.1186 ± 0.0030 … 0.1136 ± 0.0071 (−0.005)\""),
]

# Defaults a params.yaml comment or RESULTS.md justifies for which the rows hold no comparison.
NOT_AVAILABLE = [
    ("sasrec.train.grad_clip = 0.0", "5.0", ("\"never bit with clip 5 (issue 11 probe)\": the probe is not in the "
     "rows; every pair of rows that differs in grad_clip also differs in another setting (item_dropout, windows)")),
    ("mojito.loss = ce", "bce", "\"ce trained better on ML-100K\": no MOJITO row with loss bce in either file"),
    ("bert4rec.train.lr = 0.003", "0.001 / 0.002", ("no row isolates the rate at dim 64 (the only lr 1e-3 row, "
     "`bert4rec@mask_prob=0.2,lr=0.001,last_item_share=0.1`, also changes the mask rate and last-item share)")),
    ("bert4rec.train.ema_warmup = true", "false (ema 0.999 both)", ("no pair in one file: every CPU row of ema "
     "0.999 has the warm-up, every GPU row of it lacks it (curves.py's BERT4REC_EMA_WARMUP_GRAPHED has no row)")),
    ("bert4rec.last_item_share = 0.1", "0", "listed in curves.py's ABLATION, but no row in either file"),
    ("sasrec.train.lr = 0.002 at dim 64", "—", "curves.py's ABLATION lists `SASREC_D64,lr=0.002`; no row"),
]


def load() -> list[dict]:
    rows = []
    for source, path in FILES.items():
        rows += [dict(r, _file=source) for r in json.loads(path.read_text())]
    return rows


def settings(row: dict) -> dict:
    """A row's model and train settings as trained, keys absent then read as the code's behaviour then."""
    config = dict(row["config"])
    if "init" in config and "weight_init" not in config:  # the model setting's earlier name
        config["weight_init"] = config.pop("init")
    out = {f"c.{k}": v for k, v in config.items()}
    out.update({f"t.{k}": v for k, v in row["train"].items() if k not in IGNORED})
    for key, value in BEFORE_THE_KEY.items():
        out.setdefault(key, value)
    return out


def differences(a: list[dict], b: list[dict]) -> tuple[list[str], list[str]]:
    """(setting differences, execution-only differences) between the two sides, from every row's stored
    settings; a setting that varies within one side is shown with all its values."""
    def canonical(value):  # 0 and 0.0 are one setting (rows store whichever the YAML of the day had)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return f"{float(value):g}"
        return json.dumps(value)

    def values(side, key):
        return sorted({canonical(settings(r).get(key)) for r in side})
    keys = set().union(*(settings(r).keys() for r in a + b))
    model, execution = [], []
    for key in sorted(keys):
        va, vb = values(a, key), values(b, key)
        if va != vb:
            text = f"{key[2:]} {'/'.join(va)} → {'/'.join(vb)}".replace('"', "")
            (execution if key in EXECUTION else model).append(text)
    return model, execution


def verdict(chosen: list[float], alt: list[float]) -> str:
    delta = statistics.mean(chosen) - statistics.mean(alt)
    if len(chosen) < 2:
        return ("yes" if delta > 0 else "no" if delta < 0 else "equal") + " (1 seed)"
    spread = max(statistics.stdev(chosen), statistics.stdev(alt))
    higher = sum(c > a for c, a in zip(chosen, alt))
    if abs(delta) <= spread:
        lean = "chosen" if delta > 0 else "alternative"
        return f"tie within 1 sd (Δ {delta:+.4f}, sd {spread:.4f}; leans {lean}; chosen higher on {higher}/{len(chosen)} seeds)"
    return f"{'yes' if delta > 0 else 'no'} (Δ {delta:+.4f} > sd {spread:.4f}; chosen higher on {higher}/{len(chosen)} seeds)"


def short(verdict_text: str) -> str:
    return verdict_text.split(" (")[0]


def seeds_text(seeds: list[int]) -> str:
    return ", ".join(map(str, seeds))


def main() -> None:
    rows = load()
    header = ("| # | setting (params.yaml key = chosen value) | alternative | dataset (file) | seeds (n each side) "
              "| validation NDCG@10 chosen vs alternative | test NDCG@10 chosen vs alternative "
              "| validation agrees? (favours the chosen value) | test favours the chosen value? | rows used (run strings) | stored configs differ in; notes |")
    lines = [header, "|" + "---|" * 11]
    tally: dict[str, list[str]] = {}
    for i, (setting, alternative, source, dataset, run_c, run_a, note) in enumerate(COMPARISONS, 1):
        side_c = [r for r in rows if r["_file"] == source and r["dataset"] == dataset and r["run"] == run_c]
        side_a = [r for r in rows if r["_file"] == source and r["dataset"] == dataset and r["run"] == run_a]
        if not side_c or not side_a:
            raise SystemExit(f"comparison {i}: no rows for {run_c if not side_c else run_a} in {source} {dataset}")
        shared = sorted({row_seed(r) for r in side_c} & {row_seed(r) for r in side_a})
        if not shared:
            raise SystemExit(f"comparison {i}: the two runs share no seed")
        c = sorted((r for r in side_c if row_seed(r) in shared), key=row_seed)
        a = sorted((r for r in side_a if row_seed(r) in shared), key=row_seed)
        vc, va = [r["valid_ndcg@10"] for r in c], [r["valid_ndcg@10"] for r in a]
        tc, ta = [r["test_ndcg@10"] for r in c], [r["test_ndcg@10"] for r in a]
        v_verdict, t_verdict = verdict(vc, va), verdict(tc, ta)
        model_diff, exec_diff = differences(c, a)
        notes = [f"differ in: {'; '.join(model_diff)}" if model_diff else "differ in: nothing (!)"]
        if exec_diff:
            notes.append(f"execution only: {'; '.join(exec_diff)}")
        unconverged = sorted({f"{r['run'] == run_c and 'chosen' or 'alternative'} seed {row_seed(r)} "
                              f"stopped by {r['stopped_by']}" for r in c + a if r["stopped_by"] != "early_stopping"})
        if unconverged:
            notes.append("not early-stopped: " + ", ".join(unconverged))
        extra = [f"{name} also has seeds {seeds_text(sorted({row_seed(r) for r in side} - set(shared)))}"
                 for name, side in (("chosen", side_c), ("alternative", side_a))
                 if {row_seed(r) for r in side} - set(shared)]
        notes += extra
        notes.append(note)
        file = "models.json" if source == "CPU" else "models-gpu.json"
        lines.append(
            f"| {i} | {setting} | {alternative} | {dataset} ({source}) | {seeds_text(shared)} ({len(shared)} / {len(shared)}) "
            f"| {mean_sd(vc)} vs {mean_sd(va)} | {mean_sd(tc)} vs {mean_sd(ta)} | {v_verdict} | {t_verdict} "
            f"| {file}: `{run_c}` vs `{run_a}` | {' — '.join(notes)} |")
        tally.setdefault(short(v_verdict), []).append(f"#{i}")
    print("Generated by `python benchmarks/valid_vs_test.py` from benchmarks/results/models.json and models-gpu.json (read-only).")
    print()
    print("\n".join(lines))
    print()
    print("Comparisons the rows cannot make (no validation comparison available):")
    print()
    print("| setting | alternative | why |\n|---|---|---|")
    for setting, alternative, why in NOT_AVAILABLE:
        print(f"| {setting} | {alternative} | {why} |")
    print()
    print("Validation verdicts, counted: " + "; ".join(f"{k}: {len(v)} ({', '.join(v)})"
                                                     for k, v in sorted(tally.items())))


if __name__ == "__main__":
    main()
