"""A throwaway PostgreSQL for the store tests: $ALLOCTRACE_TEST_PG (a URL whose user may create
databases; .ci/run sets it), else a cluster made here with initdb/pg_ctl on a free loopback port,
stopped when the tests end. Each test gets a database of its own."""
from __future__ import annotations

import glob
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

ENV = "ALLOCTRACE_TEST_PG"


def pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """initdb + pg_ctl in a temp folder (as the `postgres` user when run as root: initdb refuses root)."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="alloctrace-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user:
            shutil.chown(self.dir, self.user)

    def _run(self, *args: str):
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    def start(self) -> str:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.dir / "log"), "-w", "start")
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self):
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def new_database(admin_url: str) -> str:
    """A fresh database on the server of `admin_url`; its URL."""
    import psycopg

    name = f"alloctrace_{secrets.token_hex(4)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + "/" + name


def drop_database(admin_url: str, url: str):
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
