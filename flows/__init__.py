"""Prefect flows: when the pipeline runs and what happens after it (validation, gate, registry).

They orchestrate `recsys` functions and `dvc`; they never re-implement the pipeline graph (dvc.yaml owns it).
Each module runs with its defaults as `python -m flows.<name>`.
"""
