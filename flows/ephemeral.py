"""Prefect's temporary API server for a flow run from a terminal, out of the terminal's reach.

Without `PREFECT_API_URL`, Prefect starts a temporary server as a child of the flow process, in its process
group: a Ctrl-C in the terminal reaches the server too, which dies at once, and the interrupted run then
retries its last reports against a dead server — it hung until killed. `start_in_own_session` starts that
server first, in a session of its own (the terminal's SIGINT reaches the run alone, which reports the
interruption and exits; Prefect stops the server at exit), bound to this process (PR_SET_PDEATHSIG: it gets
SIGTERM when the run dies, even from a SIGKILL, instead of serving on for nobody). Linux only: elsewhere
nothing would end a server outside the run's process group, so Prefect starts it as before. Prefect's later
requests for the temporary server get this one: it keeps one per port.
"""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Callable
from typing import Any

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child get SIGTERM when this process dies (Linux; from the main thread
    only: the signal comes when the thread that started the child ends), resolved here, before the fork, so
    the child only calls it — and ends at once if this process died before it could (the child of a dead
    parent is never signalled)."""
    import threading

    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return None
    import ctypes
    import os
    import signal

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def bind() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:
            os._exit(0)

    return bind


def start_in_own_session() -> str | None:
    """Start Prefect's temporary server (when no `PREFECT_API_URL` is set and the ephemeral server is
    allowed) in its own session, bound to this process; returns its API URL — or None, leaving the server to
    Prefect (in this process group), when a server is configured or the binding is not there: on other
    systems than Linux, or off the main thread."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return None  # (before the server's modules are imported: ~0.6 s a flow process against a server)
    from prefect.server.api import server as prefect_server

    bind = _die_with_parent()
    if bind is None:  # out of the terminal's session, nothing would end it with the run: as Prefect starts it
        return None

    def popen(*args: Any, **kwargs: Any) -> subprocess.Popen:
        return subprocess.Popen(*args, **kwargs, start_new_session=True,
                                preexec_fn=bind)  # noqa: PLW1509 (the main thread, no other yet)

    # Prefect's server module looks `subprocess.Popen` up when it starts the server: for that call only,
    # it sees a copy of the module whose Popen adds the session (no other thread's Popen is touched).
    shim = types.ModuleType("subprocess")
    shim.__dict__.update(vars(subprocess))
    shim.Popen = popen  # type: ignore[attr-defined]
    original = prefect_server.subprocess
    prefect_server.subprocess = shim  # type: ignore[attr-defined]
    try:
        server = prefect_server.SubprocessASGIServer()
        server.start()
    finally:
        prefect_server.subprocess = original  # type: ignore[attr-defined]
    return server.api_url
