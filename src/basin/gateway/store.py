"""Where the gateway's state outlives the process: a SQLite file (one gateway)
or a Redis server (several replicas serving one deployment, each under its
own replica name).

A store holds three things (:mod:`basin.gateway.persist` says what is in
them): one record per live session, keyed by session id; one metadata record
(the policy's own state, the parked order, the counters, the clock); and the
recent arrival times. Writes come in batches from a worker thread, each batch
applied atomically (one SQLite transaction, one Redis MULTI), so a process
killed in the middle of a write leaves the previous batch whole.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from basin.errors import BasinInputError

#: A replica's name: what its keys in a shared store are filed under.
REPLICA_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Batch:
    """The changes of one write: the metadata (replaced whole), sessions written or
    replaced (id to JSON record), sessions deleted, new arrivals ``(uid, time)``,
    and the time before which arrivals are dropped."""

    meta: str
    upserts: dict[str, str] = field(default_factory=dict)
    deletes: tuple[str, ...] = ()
    arrivals: tuple[tuple[int, float], ...] = ()
    horizon_s: float = float("-inf")


@dataclass(frozen=True, slots=True)
class Stored:
    """Everything a store holds, as read at start (None: an empty store)."""

    meta: str
    sessions: list[str]
    arrivals: list[float]


class StateStore(Protocol):
    where: str

    def load(self) -> Stored | None: ...

    def write(self, batch: Batch) -> None: ...

    def close(self) -> None: ...


class SQLiteStore:
    """One gateway's state in a SQLite file (write-ahead log: a write is one
    transaction, readers never block it)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.where = f"sqlite file {self.path}"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(
                "CREATE TABLE IF NOT EXISTS meta (k INTEGER PRIMARY KEY CHECK (k = 0), v TEXT NOT NULL);"
                "CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, v TEXT NOT NULL);"
                "CREATE TABLE IF NOT EXISTS arrivals (uid INTEGER PRIMARY KEY, t REAL NOT NULL);")
        except sqlite3.Error as exc:
            raise BasinInputError(f"field 'state_store': cannot open {self.path} as a SQLite state store "
                                  f"({exc}); name a writable file") from None
        self._lock = threading.Lock()

    def load(self) -> Stored | None:
        with self._lock:
            row = self._db.execute("SELECT v FROM meta WHERE k = 0").fetchone()
            if row is None:
                return None
            sessions = [v for (v,) in self._db.execute("SELECT v FROM sessions")]
            arrivals = [t for (t,) in self._db.execute("SELECT t FROM arrivals ORDER BY t")]
        return Stored(row[0], sessions, arrivals)

    def write(self, batch: Batch) -> None:
        with self._lock:
            db = self._db
            db.execute("BEGIN")
            try:
                db.execute("INSERT OR REPLACE INTO meta (k, v) VALUES (0, ?)", (batch.meta,))
                if batch.deletes:
                    db.executemany("DELETE FROM sessions WHERE id = ?", [(d,) for d in batch.deletes])
                if batch.upserts:
                    db.executemany("INSERT OR REPLACE INTO sessions (id, v) VALUES (?, ?)", batch.upserts.items())
                if batch.arrivals:
                    db.executemany("INSERT OR REPLACE INTO arrivals (uid, t) VALUES (?, ?)", batch.arrivals)
                db.execute("DELETE FROM arrivals WHERE t < ?", (batch.horizon_s,))
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()


class RedisStore:
    """State in Redis under ``basin:gateway:REPLICA:*``: several gateway
    replicas of one deployment share the server, each under its own name, and
    a replica restarted under its name (on any host) takes its state back."""

    def __init__(self, url: str, replica: str):
        # Lazy: redis takes about 90 ms to import; only this path uses it.
        import redis

        self.where = f"redis {_redacted(url)} (replica {replica})"
        self._redis = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError,)
        prefix = f"basin:gateway:{replica}:"
        self._meta, self._sessions, self._arrivals = prefix + "meta", prefix + "sessions", prefix + "arrivals"
        try:
            self._redis.ping()
        except redis.RedisError as exc:
            raise BasinInputError(f"field 'state_store': cannot reach {self.where} ({exc}); start the server or "
                                  "fix the URL") from None

    def load(self) -> Stored | None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.get(self._meta)
        pipe.hvals(self._sessions)
        pipe.zrange(self._arrivals, 0, -1, withscores=True)
        meta, sessions, arrivals = pipe.execute()
        if meta is None:
            return None
        return Stored(meta.decode(), [v.decode() for v in sessions], [t for _, t in arrivals])

    def write(self, batch: Batch) -> None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(self._meta, batch.meta)
        if batch.deletes:
            pipe.hdel(self._sessions, *batch.deletes)
        if batch.upserts:
            pipe.hset(self._sessions, mapping=dict(batch.upserts.items()))
        if batch.arrivals:
            pipe.zadd(self._arrivals, {str(uid): t for uid, t in batch.arrivals})
        pipe.zremrangebyscore(self._arrivals, "-inf", f"({batch.horizon_s!r}")
        pipe.execute()

    def close(self) -> None:
        self._redis.close()


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    return url if parts.password is None else url.replace(f":{parts.password}@", ":***@")


def open_store(spec: str, replica: str) -> StateStore:
    """``redis://`` / ``rediss://`` / ``unix://`` URLs open a :class:`RedisStore`; anything else is a
    SQLite file path (``sqlite:PATH`` also reads as one)."""
    if not REPLICA_NAME.match(replica):
        raise BasinInputError(f"field 'state_replica': {replica[:40]!r} is not a name; use 1-64 letters, "
                              "digits, '.', '_' or '-'")
    if spec.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(spec, replica)
    return SQLiteStore(spec.removeprefix("sqlite:"))
