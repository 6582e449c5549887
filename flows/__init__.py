"""Prefect flows: when the pipeline runs and what happens after it (validation, gate, registry).

They orchestrate `recsys` functions and `dvc`; they never re-implement the pipeline graph (dvc.yaml owns it).
Each module runs with its defaults as `python -m flows.<name>`.

Telemetry is off wherever a flow can start — `python -m flows.*`, a deployment's worker, `flows.serve` —
because every one of them imports this package before Prefect: without it the ephemeral server's telemetry
service tries to phone home and prints an error on a machine without network. An explicit setting wins.
"""

import os

for _name, _value in (("DO_NOT_TRACK", "1"), ("PREFECT_SERVER_ANALYTICS_ENABLED", "false"),
                      ("GX_ANALYTICS_ENABLED", "false")):
    os.environ.setdefault(_name, _value)
