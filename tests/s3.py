"""A throwaway S3-compatible server for tests: moto's server mode (`moto[server]`, a dev dependency) on a free
127.0.0.1 port, stopped at teardown. It is real S3 over HTTP — boto3, s3fs and dvc-s3 talk to it as they would
to AWS or MinIO — so nothing is mocked inside the process under test.

Import the fixture into a test module: `from s3 import s3_server  # noqa: F401`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from server_support import free_port

ACCESS_KEY_ID = "testing"  # moto accepts any credentials; S3 clients still need some to sign requests
SECRET_ACCESS_KEY = "testing"
STARTUP_TIMEOUT_S = 90  # a loaded 2-core box takes seconds just to import moto and flask


def isolated_aws_env(env: dict[str, str]) -> dict[str, str]:
    """`env` without the caller's AWS settings: no profile, shared config or endpoint from this machine can
    redirect or re-sign a test's requests, no instance-metadata lookups, and no proxy for the local server."""
    out = {name: value for name, value in env.items() if not name.startswith("AWS_")}
    missing = str(Path(tempfile.gettempdir()) / "recsys-tests-no-aws-config")
    out.update(AWS_CONFIG_FILE=missing, AWS_SHARED_CREDENTIALS_FILE=missing, AWS_EC2_METADATA_DISABLED="true")
    for name in ("NO_PROXY", "no_proxy"):
        out[name] = ",".join(filter(None, [out.get(name, ""), "127.0.0.1", "localhost"]))
    return out


@dataclass
class S3Server:
    endpoint_url: str
    access_key_id: str = ACCESS_KEY_ID
    secret_access_key: str = SECRET_ACCESS_KEY

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
                            aws_access_key_id=self.access_key_id,
                            aws_secret_access_key=self.secret_access_key)

    def create_bucket(self) -> str:
        """A new, empty bucket (a fresh name each call, so tests never see each other's objects)."""
        name = f"recsys-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]


def _server_command(port: int) -> list[str]:
    executable = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    base = [executable] if executable else [sys.executable, "-m", "moto.server"]
    return [*base, "--host", "127.0.0.1", "--port", str(port)]


def _answers(url: str) -> bool:
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer means the server is up
    except OSError:
        return False


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)


def _start(log_path: Path) -> tuple[subprocess.Popen, str]:
    """Start the server on a free port and wait until it answers. Another process may take the port between
    choosing and binding it: then the server exits at once and we try another port."""
    env = isolated_aws_env(dict(os.environ))
    for _ in range(3):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with log_path.open("w") as log:
            proc = subprocess.Popen(_server_command(port), stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while proc.poll() is None:
            if _answers(url):
                return proc, url
            if time.monotonic() > deadline:
                _stop(proc)
                raise RuntimeError(f"the S3 test server (moto) did not answer on {url} within "
                                   f"{STARTUP_TIMEOUT_S} s:\n{log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.3)
    raise RuntimeError(f"the S3 test server (moto) exited at start, three times (last on port {port}):\n"
                       f"{log_path.read_text(errors='replace')[-2000:]}")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("dvc_s3") is None:
        pytest.fail("moto[server] and dvc-s3 are test dependencies: run `pip install -e '.[dev]'`")
    base = Path(tempfile.mkdtemp(prefix="recsys-s3-"))
    proc = None
    try:
        proc, url = _start(base / "server.log")
        yield S3Server(url)
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(base, ignore_errors=True)
