"""A throwaway PostgreSQL server for tests: initdb into a tmp dir, start on a free 127.0.0.1 port, stop at
teardown. Tests using it are skipped only where the server binaries are absent.

Import the fixtures into a test module: `from pg import pg_server, pg_url  # noqa: F401`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

PG_BIN_CANDIDATES = [
    os.environ.get("RECSYS_PG_BIN", ""),
    "/usr/lib/postgresql/15/bin",
    "/usr/lib/postgresql/16/bin",
    "/usr/lib/postgresql/17/bin",
    "/usr/local/pgsql/bin",
]


def find_pg_bin() -> Path | None:
    for candidate in PG_BIN_CANDIDATES:
        if candidate and (Path(candidate) / "initdb").is_file() and (Path(candidate) / "pg_ctl").is_file():
            return Path(candidate)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("pg_ctl") else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PgServer:
    bin_dir: Path
    data_dir: Path
    port: int
    run_as: list[str]

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        import psycopg

        name = f"t_{uuid.uuid4().hex[:16]}"  # generated here, never user input: safe as an identifier
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _run(cmd: list[str], run_as: list[str]) -> None:
    result = subprocess.run(run_as + cmd, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}): {result.stderr or result.stdout}")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    bin_dir = find_pg_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found")
    pytest.importorskip("psycopg")
    run_as: list[str] = []
    if os.geteuid() == 0:
        # The server refuses to run as root; run it as the `postgres` system user when we are root.
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no `postgres` user to run the server as")
        runuser = shutil.which("runuser")
        if runuser is None:
            pytest.skip("running as root and `runuser` is unavailable")
        run_as = [runuser, "-u", "postgres", "--"]
    # Not under pytest's tmp dir: that is private to the test user (0700), and when tests run as root the
    # server runs as `postgres`, which must be able to reach its data directory.
    base = Path(tempfile.mkdtemp(prefix="recsys-pg-"))
    if run_as:
        os.chown(base, user.pw_uid, user.pw_gid)
    data_dir = base / "data"
    try:
        _run([str(bin_dir / "initdb"), "-D", str(data_dir), "-U", "postgres", "-A", "trust", "-E", "UTF8",
              "--no-sync"], run_as)
        port = _free_port()
        options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"
        _run([str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-o", options, "-l", str(base / "server.log"),
              "-w", "-t", "60", "start"], run_as)
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    server = PgServer(bin_dir, data_dir, port, run_as)
    try:
        yield server
    finally:
        subprocess.run(run_as + [str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-m", "immediate", "-w",
                                 "stop"], capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """A fresh, empty database on the test server for one test."""
    name = pg_server.create_database()
    try:
        yield pg_server.url(name)
    finally:
        pg_server.drop_database(name)
