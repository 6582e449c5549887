"""Retraining system for sequential recommenders: plain Python, no orchestration imports.

`flows/` wraps these functions as Prefect tasks; `dvc.yaml` calls their `main()` entry points.
"""

__version__ = "0.1.0"
