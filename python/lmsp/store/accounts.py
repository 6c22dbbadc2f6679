"""The store's accounts: the service's identity and settings, its clients and their
pairing codes (LMSP chapter 11's ``service_config``, ``clients``, ``pairings``)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Iterable

from .. import objects as obj
from ..errors import Conflict, InvalidRequest, NotFound, RateLimited
from .base import StoreBase, dumps
from ..contracts import MAX_PRIORITY
from .sharing import LIMITS, hour_of
from .states import STARTED_SQL, UNFINISHED_SQL


class AccountsArea(StoreBase):
    """Identity, settings, clients and pairings."""

    # -- identity & settings ---------------------------------------------------------------
    def identity(self) -> dict:
        """``{"service_id", "created_at"}``, created on the first call against an empty database."""
        with self._db.read() as conn:
            rows = dict(
                conn.execute(
                    "SELECT key, value FROM service_config WHERE key IN ('identity.service_id', 'identity.created_at')"
                )
            )
        if len(rows) < 2:
            with self._db.write() as conn:
                now = self._clock()
                conn.execute(
                    "INSERT OR IGNORE INTO service_config VALUES ('identity.service_id', ?)",
                    (dumps(self._new_id("svc")),),
                )
                conn.execute(
                    "INSERT OR IGNORE INTO service_config VALUES ('identity.created_at', ?)", (dumps(int(now)),)
                )
                rows = dict(
                    conn.execute(
                        "SELECT key, value FROM service_config "
                        "WHERE key IN ('identity.service_id', 'identity.created_at')"
                    )
                )
        return {
            "service_id": json.loads(rows["identity.service_id"]),
            "created_at": json.loads(rows["identity.created_at"]),
        }

    def get_setting(self, key: str, default: Any = None) -> Any:
        with self._db.read() as conn:
            row = conn.execute("SELECT value FROM service_config WHERE key = ?", ("setting." + key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def set_setting(self, key: str, value: Any) -> None:
        text = dumps(value)
        with self._db.write() as conn:
            conn.execute(
                "INSERT INTO service_config VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                ("setting." + key, text),
            )

    # -- clients & pairing -----------------------------------------------------------------
    def create_client(self, *, name: str, scopes: list[str], token_hash: str) -> dict:
        if not isinstance(name, str) or not name.strip():
            raise InvalidRequest("a client needs a name", param="name")
        if not isinstance(scopes, (list, tuple)) or not all(isinstance(s, str) for s in scopes):
            raise InvalidRequest("scopes must be a list of strings", param="scopes")
        with self._db.write() as conn:
            return self._insert_client(conn, name, list(scopes), token_hash)

    def _insert_client(self, conn: sqlite3.Connection, name: str, scopes: list[str], token_hash: str) -> dict:
        cid = self._new_id("cli")
        try:
            conn.execute(
                "INSERT INTO clients (id, name, scopes, token_hash, created_at) VALUES (?,?,?,?,?)",
                (cid, name, dumps(scopes), token_hash, self._clock()),
            )
        except sqlite3.IntegrityError as exc:
            raise Conflict("a client with this token already exists") from exc
        return self._clients(conn, "c.id = ?", (cid,))[0]

    def _clients(self, conn: sqlite3.Connection, where: str, args: tuple) -> list[dict]:
        """Client objects with their activity: the time of their newest task (by the
        tasks_client index: ids grow with time), their tokens of the last 24 hours and
        of today (UTC) from their hours of usage."""
        hour = hour_of(self._clock())
        rows = conn.execute(
            "SELECT c.*, (SELECT created_at FROM tasks t WHERE t.client_id = c.id ORDER BY t.id DESC LIMIT 1)"
            " AS last_task_at, (SELECT coalesce(sum(tokens), 0) FROM client_usage u WHERE u.client_id = c.id"
            " AND u.hour > ?) AS tokens_24h, (SELECT coalesce(sum(tokens), 0) FROM client_usage u"
            f" WHERE u.client_id = c.id AND u.hour >= ?) AS tokens_today FROM clients c WHERE {where} ORDER BY c.id",
            (hour - 24, hour - hour % 24, *args),
        )
        return [
            {
                **obj.client_object(r),
                "last_task_at": obj.ts(r["last_task_at"]),
                "tokens_24h": r["tokens_24h"],
                "tokens_today": r["tokens_today"],
            }
            for r in rows
        ]

    def client_by_token_hash(self, token_hash: str) -> dict | None:
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT * FROM clients WHERE token_hash = ? AND revoked_at IS NULL", (token_hash,)
            ).fetchone()
        return None if row is None else obj.client_object(row)

    def copy_client(self, *, client_id: str, name: str, scopes: list[str], token_hash: str) -> dict | None:
        """A client of another box of the fleet, copied here under its own id (its tasks
        here name it); None when a client of that id is here already (revoked, or with
        another token)."""
        with self._db.write() as conn:
            done = conn.execute(
                "INSERT OR IGNORE INTO clients (id, name, scopes, token_hash, created_at) VALUES (?,?,?,?,?)",
                (client_id, name, dumps(list(scopes)), token_hash, self._clock()),
            )
            if done.rowcount != 1:
                return None
            row = conn.execute("SELECT * FROM clients WHERE id = ?", (client_id,)).fetchone()
        return obj.client_object(row)

    def revoke_copy(self, client_id: str) -> None:
        """Revoke a client here that another box revoked (nothing when it is not here)."""
        with self._db.write() as conn:
            conn.execute(
                "UPDATE clients SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (self._clock(), client_id)
            )

    def revoked_client_ids(self) -> list[str]:
        """The ids of the revoked clients, oldest first."""
        with self._db.read() as conn:
            return [r[0] for r in conn.execute("SELECT id FROM clients WHERE revoked_at IS NOT NULL ORDER BY id")]

    def client_active(self, client_id: str) -> bool:
        """Whether the client exists and is not revoked (an open stream asks now and then)."""
        with self._db.read() as conn:
            return (
                conn.execute("SELECT 1 FROM clients WHERE id = ? AND revoked_at IS NULL", (client_id,)).fetchone()
                is not None
            )

    def note_seen(self, client_id: str, every: float) -> bool:
        """Record that the client's token was used now, unless its ``last_seen_at`` is less
        than ``every`` seconds old; True when written."""
        with self._db.write() as conn:
            now = self._clock()
            return (
                conn.execute(
                    "UPDATE clients SET last_seen_at = ? WHERE id = ? AND (last_seen_at IS NULL OR last_seen_at <= ?)",
                    (now, client_id, now - every),
                ).rowcount
                > 0
            )

    def list_clients(self) -> list[dict]:
        with self._db.read() as conn:
            return self._clients(conn, "1", ())

    def revoke_client(self, client_id: str) -> dict:
        with self._db.write() as conn:
            conn.execute(
                "UPDATE clients SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (self._clock(), client_id)
            )
            found = self._clients(conn, "c.id = ?", (client_id,))
            if not found:
                raise NotFound(f"no client {client_id}")
            return found[0]

    def create_pairing(self, *, code_hash: str, scopes: list[str], expires_at: float, name: str | None = None) -> dict:
        if not isinstance(scopes, (list, tuple)) or not all(isinstance(s, str) for s in scopes):
            raise InvalidRequest("scopes must be a list of strings", param="scopes")
        pid = self._new_id("pair")
        with self._db.write() as conn:
            try:
                conn.execute(
                    "INSERT INTO pairings (id, code_hash, name, scopes, created_at, expires_at) VALUES (?,?,?,?,?,?)",
                    (pid, code_hash, name, dumps(list(scopes)), self._clock(), float(expires_at)),
                )
            except sqlite3.IntegrityError as exc:
                raise Conflict("this pairing code already exists") from exc
            return obj.pairing_object(conn.execute("SELECT * FROM pairings WHERE id = ?", (pid,)).fetchone())

    def redeem_pairing(
        self,
        *,
        code_hash: str,
        client_name: str,
        token_hash: str,
        max_failures: int | None = None,
        window: float = 60.0,
    ) -> dict:
        """Use a pairing code once and create its client; NotFound if unknown, used or
        expired, which counts as a failed attempt. With ``max_failures``: RateLimited
        once that many attempts failed within ``window`` seconds. The count, the code's
        use and the failure's record are one transaction, so concurrent guesses
        cannot all pass the count before any of them is recorded."""
        if not isinstance(client_name, str) or not client_name.strip():
            raise InvalidRequest("client_name is required", param="client_name")
        client = None
        with self._db.write() as conn:
            now = self._clock()
            limited = (
                max_failures is not None
                and conn.execute("SELECT count(*) FROM pairing_failures WHERE at >= ?", (now - window,)).fetchone()[0]
                >= max_failures
            )
            if not limited:
                row = conn.execute(
                    "SELECT * FROM pairings WHERE code_hash = ? AND used_at IS NULL AND expires_at > ?",
                    (code_hash, now),
                ).fetchone()
                if row is None:
                    conn.execute("INSERT INTO pairing_failures (at) VALUES (?)", (now,))  # committed below
                else:
                    client = self._insert_client(conn, client_name, json.loads(row["scopes"]), token_hash)
                    conn.execute(
                        "UPDATE pairings SET used_at = ?, client_id = ? WHERE id = ?", (now, client["id"], row["id"])
                    )
        if limited:
            raise RateLimited("too many failed pairing attempts; try again later", retry_after=int(window))
        if client is None:
            raise NotFound("unknown, used or expired pairing code", param="code")
        return client

    def set_limits(self, client_id: str, **limits: int | None) -> dict[str, int | None]:
        """Set some of a client's :data:`LIMITS` (None: no limit; ``priority`` 1 to 100);
        returns them all."""
        for name, value in limits.items():
            if name not in LIMITS:
                raise InvalidRequest(f"unknown limit {name!r}", param=name)
            low = 1 if name == "priority" else 0
            if value is None and name == "priority":
                raise InvalidRequest("'priority' is a number from 1 to 100", param=name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise InvalidRequest(f"{name!r} must be an integer of at least {low} or null", param=name)
            if name == "priority" and value is not None and value > MAX_PRIORITY:
                raise InvalidRequest(f"'priority' is at most {MAX_PRIORITY}", param=name)
        with self._db.write() as conn:
            if conn.execute("SELECT 1 FROM clients WHERE id = ?", (client_id,)).fetchone() is None:
                raise NotFound(f"no client {client_id}")
            for name, value in limits.items():
                conn.execute(f"UPDATE clients SET {name} = ? WHERE id = ?", (value, client_id))
            return self._limits(conn, client_id)

    def client_limits(self, client_id: str) -> dict[str, int | None]:
        with self._db.read() as conn:
            return self._limits(conn, client_id)

    @staticmethod
    def _limits(conn: sqlite3.Connection, client_id: str) -> dict[str, int | None]:
        row = conn.execute(f"SELECT {', '.join(LIMITS)} FROM clients WHERE id = ?", (client_id,)).fetchone()
        if row is None:
            raise NotFound(f"no client {client_id}")
        return dict(zip(LIMITS, row))

    def usage(self, client_ids: Iterable[str] | None = None, *, since: float = 0.0) -> list[dict[str, Any]]:
        """The tasks and tokens of each client's hours since ``since``, oldest first."""
        sql = "SELECT client_id, hour, tasks, tokens FROM client_usage WHERE hour >= ?"
        args: list[Any] = [hour_of(since)]
        if client_ids is not None:
            ids = list(client_ids)
            sql += f" AND client_id IN ({', '.join('?' * len(ids))})"
            args += ids
        with self._db.read() as conn:
            rows = conn.execute(sql + " ORDER BY hour, client_id", args).fetchall()
        return [{"client_id": c, "hour_start": h * 3600, "tasks": n, "tokens": t} for c, h, n, t in rows]

    def client_figures(self) -> dict[str, dict[str, int]]:
        """Each client's ``queued`` and ``running`` tasks and ``tokens`` of this hour, for
        ``/metrics``: one grouped query (the unfinished tasks by ``tasks_status``, this
        hour's usage by ``client_usage_hour``); clients with none of them are left out."""
        with self._db.read() as conn:
            rows = conn.execute(CLIENT_FIGURES_SQL, (hour_of(self._clock()),)).fetchall()
        return {cid: {"queued": q, "running": r, "tokens": t} for cid, q, r, t in rows}


CLIENT_FIGURES_SQL = (
    "SELECT client_id, sum(queued), sum(running), sum(tokens) FROM ("
    f" SELECT client_id, status = 'queued' AS queued, status IN {STARTED_SQL} AS running, 0 AS tokens"
    f" FROM tasks WHERE status IN {UNFINISHED_SQL} AND client_id IS NOT NULL"
    " UNION ALL SELECT client_id, 0, 0, tokens FROM client_usage WHERE hour = ?"
    ") GROUP BY client_id ORDER BY client_id"
)
