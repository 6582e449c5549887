"""Prefect flows: when the pipeline runs and what happens after it (validation, gate, registry).

They orchestrate `recsys` functions and `dvc`; they never re-implement the pipeline graph (dvc.yaml owns it).
Each module runs with its defaults as `python -m flows.<name>`.

Telemetry is off wherever a flow can start — `python -m flows.*`, a deployment's worker, `flows.serve` —
because every one of them imports this package before Prefect: without it the ephemeral server's telemetry
service tries to phone home and prints an error on a machine without network. An explicit setting wins.
The ephemeral API gets 120 s to start instead of 20: on a loaded 2-core machine 20 s is not always enough.
"""

import os

for _name, _value in (("DO_NOT_TRACK", "1"), ("PREFECT_SERVER_ANALYTICS_ENABLED", "false"),
                      ("GX_ANALYTICS_ENABLED", "false"), ("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")):
    os.environ.setdefault(_name, _value)
