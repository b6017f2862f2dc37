"""A real primary and streaming standby, and a TCP proxy, for the failover scenarios.

:class:`Cluster` builds both servers from the machine's PostgreSQL binaries (``pg_config
--bindir``, else ``/usr/lib/postgresql/15/bin``): ``initdb`` a primary, ``pg_basebackup
-R`` a standby from it, each on a free port of 127.0.0.1 in a temporary directory. Run as
root, every command runs as the ``postgres`` OS user (initdb refuses root) through
``runuser``, and the directories are handed to that user. Replication is synchronous
(``synchronous_standby_names``: a commit returns once the standby has flushed it) or
asynchronous. :meth:`Cluster.close` stops both servers and removes everything, whatever
state a scenario left them in.

:class:`Proxy` forwards TCP from a port of its own to a backend the test can switch; it
can also black-hole (keep both sockets open, forward nothing) and cut (close every
connection it carries). It runs an asyncio loop on a thread of its own.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psycopg
from sqlalchemy.engine import URL

from sqla_jobs import testing

DEFAULT_BINDIR = "/usr/lib/postgresql/15/bin"
#: The OS user the servers run as when the tests run as root.
PG_USER = "postgres"
STANDBY_NAME = "standby"


def bindir() -> Path:
    """Where the PostgreSQL server binaries are (``pg_config --bindir`` first)."""
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        found = subprocess.run(
            ["pg_config", "--bindir"], check=True, capture_output=True, text=True
        ).stdout.strip()
        if (Path(found) / "initdb").exists():
            return Path(found)
    return Path(DEFAULT_BINDIR)


def have_binaries() -> bool:
    return all((bindir() / tool).exists() for tool in ("initdb", "pg_ctl", "pg_basebackup"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_pg_user(argv: Sequence[str]) -> list[str]:
    if os.geteuid() != 0:
        return list(argv)
    return ["runuser", "-u", PG_USER, "--", *argv]


def _run(argv: Sequence[str], timeout: float = 120) -> None:
    done = subprocess.run(_as_pg_user(argv), capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")


_TEMPLATE: list[Path] = []


def _initdb_once() -> Path:
    """An initdb'ed data directory, made once per process and copied for each primary
    (initdb takes seconds; a copy, a fraction of one)."""
    if not _TEMPLATE:
        root = Path(tempfile.mkdtemp(prefix="sqla_jobs_initdb_"))
        if os.geteuid() == 0:
            pg = pwd.getpwnam(PG_USER)
            os.chown(root, pg.pw_uid, pg.pw_gid)
        atexit.register(shutil.rmtree, root, True)
        _run(
            [
                str(bindir() / "initdb"),
                "-D",
                str(root / "data"),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ]
        )
        _TEMPLATE.append(root / "data")
    return _TEMPLATE[0]


class Node:
    """One server: its data directory, port and log."""

    def __init__(self, root: Path, name: str) -> None:
        self.name = name
        self.datadir = root / name
        self.port = free_port()
        self.log = root / f"{name}.log"
        self.sockdir = root

    def pg_ctl(self, *args: str) -> None:
        _run([str(bindir() / "pg_ctl"), "-D", str(self.datadir), *args])

    def start(self) -> None:
        self.pg_ctl("-w", "-t", "60", "-l", str(self.log), "start")

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl("-w", "-t", "60", "-m", mode, "stop")

    def running(self) -> bool:
        return (self.datadir / "postmaster.pid").exists()

    def conninfo(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def url(self, dbname: str = "postgres") -> URL:
        return URL.create(
            "postgresql+psycopg",
            username="postgres",
            host="127.0.0.1",
            port=self.port,
            database=dbname,
        )

    def query(self, sql: str, dbname: str = "postgres") -> object:
        with psycopg.connect(self.conninfo(dbname), autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(sql)
            row = cursor.fetchone() if cursor.description else None
        return row[0] if row else None

    def in_recovery(self) -> bool:
        return bool(self.query("SELECT pg_is_in_recovery()"))


class Cluster:
    """A primary and a streaming standby of it (synchronous if ``synchronous``)."""

    DATABASE = "jobs"

    def __init__(self, *, synchronous: bool) -> None:
        self.synchronous = synchronous
        self.root = Path(tempfile.mkdtemp(prefix="sqla_jobs_failover_"))
        if os.geteuid() == 0:
            pg = pwd.getpwnam(PG_USER)
            os.chown(self.root, pg.pw_uid, pg.pw_gid)
        self.primary = Node(self.root, "primary")
        self.standby = Node(self.root, "standby")

    def start(self) -> Cluster:
        self._init_primary()
        self.primary.start()
        self.primary.query(f"CREATE DATABASE {self.DATABASE}")
        testing.migrate(self.primary.url(self.DATABASE))
        self._init_standby()
        self.standby.start()
        if self.synchronous:
            # Only now: a synchronous primary without its standby waits at every commit.
            self.primary.query(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
            self.primary.query("SELECT pg_reload_conf()")
        self.wait_streaming()
        return self

    def _init_primary(self) -> None:
        p = self.primary
        _run(["cp", "-a", str(_initdb_once()), str(p.datadir)])
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(p.port),
            "unix_socket_directories": f"'{self.root}'",
            "wal_level": "replica",
            "max_wal_senders": "5",
            "max_connections": "100",
            "hot_standby": "on",
            "fsync": "off",  # the servers are killed, never the machine
            "shared_buffers": "32MB",
            "wal_keep_size": "256MB",
            "wal_sender_timeout": "5s",
            "wal_receiver_status_interval": "1s",
        }
        with (p.datadir / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{k} = {v}\n" for k, v in settings.items())
        with (p.datadir / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")

    def _init_standby(self) -> None:
        s, p = self.standby, self.primary
        _run(
            [
                str(bindir() / "pg_basebackup"),
                "-h",
                "127.0.0.1",
                "-p",
                str(p.port),
                "-U",
                "postgres",
                "-D",
                str(s.datadir),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ]
        )
        # -R wrote primary_conninfo; ours (appended, so it wins) names the standby for
        # synchronous_standby_names.
        with (s.datadir / "postgresql.auto.conf").open("a") as conf:
            conf.write(
                f"port = {s.port}\n"
                f"primary_conninfo = 'host=127.0.0.1 port={p.port} user=postgres "
                f"application_name={STANDBY_NAME}'\n"
            )

    def wait_streaming(self, timeout: float = 60) -> None:
        want = "sync" if self.synchronous else "async"
        query = (
            "SELECT sync_state FROM pg_stat_replication "
            f"WHERE application_name = '{STANDBY_NAME}' AND state = 'streaming'"
        )
        deadline = time.monotonic() + timeout
        while self.primary.query(query) != want:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby is not streaming ({want}) after {timeout}s")
            time.sleep(0.1)

    def promote(self) -> None:
        """Promote the standby and wait until it accepts writes."""
        self.standby.pg_ctl("-w", "-t", "60", "promote")
        deadline = time.monotonic() + 60
        while self.standby.in_recovery():
            if time.monotonic() > deadline:
                raise RuntimeError("the standby was not promoted within 60 s")
            time.sleep(0.05)

    def multi_host_url(self, *nodes: Node, attrs: str = "read-write") -> URL:
        """The URL users give: every node, libpq picks the one that accepts writes."""
        chosen = nodes or (self.primary, self.standby)
        return URL.create(
            "postgresql+psycopg",
            username="postgres",
            database=self.DATABASE,
            query={
                "host": [f"127.0.0.1:{n.port}" for n in chosen],
                "target_session_attrs": attrs,
                "connect_timeout": "3",
            },
        )

    def close(self) -> None:
        for node in (self.standby, self.primary):
            if node.running():
                with contextlib.suppress(Exception):
                    node.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def cluster(*, synchronous: bool) -> Iterator[Cluster]:
    made = Cluster(synchronous=synchronous)
    try:
        made.start()
        yield made
    finally:
        made.close()


class Proxy:
    """Forwards 127.0.0.1:``port`` to a backend port: ``switch``, ``black_hole``, ``cut``."""

    def __init__(self, backend: int, *, receive_buffer: int | None = None) -> None:
        self.backend = backend
        self.port = free_port()
        self.holes = False
        #: Links black-holed one by one, by the server's client_port of each.
        self.dead_links: set[int] = set()
        #: SO_RCVBUF of the client side of each link (see :meth:`freeze_link`).
        self.receive_buffer = receive_buffer
        #: The client side of each open link, by the server's client_port.
        self._clients: dict[int, asyncio.StreamWriter] = {}
        self._loop = asyncio.new_event_loop()
        self._links: set[asyncio.StreamWriter] = set()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name="failover-proxy", daemon=True)
        self._thread.start()
        self._started.wait(10)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", self.port)
        )
        if self.receive_buffer is not None:
            for sock in server.sockets:  # inherited by accepted sockets, before the window
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.receive_buffer)
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.backend)
        except OSError:
            writer.close()
            return
        self._links.update((writer, up_writer))
        # The upstream socket's local port: the server's client_port for this link.
        port = int(up_writer.get_extra_info("sockname")[1])
        self._clients[port] = writer
        await asyncio.gather(
            self._pump(reader, up_writer, port),
            self._pump(up_reader, writer, port),
            return_exceptions=True,
        )
        self._clients.pop(port, None)
        for w in (writer, up_writer):
            self._links.discard(w)
            w.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int
    ) -> None:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            if self.holes or port in self.dead_links:
                continue  # swallowed: the other side waits on a socket that stays open
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.close()

    def switch(self, backend: int) -> None:
        """New connections go to ``backend``; the ones open stay where they are."""
        self.backend = backend

    def black_hole(self, on: bool = True) -> None:
        """Forward nothing (both ways) without closing anything."""
        self.holes = on

    def black_hole_link(self, client_port: int) -> None:
        """Forward nothing on the one link whose server backend sees ``client_port``."""
        self.dead_links.add(client_port)

    def freeze_link(self, client_port: int) -> None:
        """Stop reading the client's bytes on one link, closing nothing: its kernel buffer
        fills, the client's data goes unacknowledged (a zero window), and only the
        client's ``tcp_user_timeout`` ends its wait. The nearest a proxy gets to a peer
        that vanished while data was in flight; an idle link it cannot make dead, since
        this host's kernel answers keepalives. Needs ``receive_buffer`` set small."""
        transport = self._clients[client_port].transport  # the link's one socket
        assert isinstance(transport, asyncio.ReadTransport)
        self._loop.call_soon_threadsafe(transport.pause_reading)

    def cut(self) -> None:
        """Close every connection now (the client sees a reset/EOF)."""

        def close_all() -> None:
            for w in list(self._links):
                w.close()

        self._loop.call_soon_threadsafe(close_all)

    def close(self) -> None:
        self.cut()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
