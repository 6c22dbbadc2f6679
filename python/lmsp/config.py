"""Service configuration: defaults, an optional TOML file, then the environment.

Precedence, lowest first: the defaults below, ``DATA_DIR/lmsp.toml`` (or the
file named by ``LMSP_CONFIG``), then ``LMSP_<FIELD>`` environment variables
(``LMSP_DATA_DIR``, ``LMSP_BIND``, ``LMSP_N_PARALLEL``...). Every field is
documented in the README's configuration reference.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

DURABILITY = ("full", "normal", "off")
RESTART_POLICIES = ("fail", "retry", "resume")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


# set in the environment by the gunicorn master once start-up recovery ran, so
# that its workers do not run it again
RECOVERED_ENV = "LMSP_STARTUP_RECOVERED"


@dataclass(frozen=True)
class Config:
    data_dir: Path = Path("data")
    bind: str = "127.0.0.1:8080"
    name: str = "lmsp"
    # fleet (README "A fleet behind nginx")
    box_id: str = ""  # this box's id in every id it makes: 1 to 8 of a-z 0-9 ("" alone, no fleet)
    peers: str = ""  # the other boxes: "ID=HOST:PORT,ID=HOST:PORT" (creates forwarded, lists gathered)
    # store
    durability: str = "full"  # full: fsync each commit; normal: WAL sync at checkpoints; off: no fsync
    busy_timeout: float = 5.0  # seconds to wait for the database lock before 503
    retention_days: float = 7.0  # finished tasks, events and responses kept this long
    idempotency_ttl_hours: float = 24.0
    # engine
    model: str | None = None  # a GGUF file to register and serve at start
    n_ctx: int = 4096  # context per sequence
    n_parallel: int = 4  # sequences decoded together
    n_threads: int = 0  # 0: all cores
    n_gpu_layers: int = 0
    n_batch: int = 512
    batch_invariant: bool = True  # CPU: a sequence's tokens do not depend on its batch (false: faster batching)
    prefix_cache: bool = True  # a free slot keeps its KV; a prompt starting the same prefills the rest only
    mmap: bool = False  # map model files instead of reading them (overwriting the file kills the worker)
    kv_cache_bytes: int = -1  # KV files of finished turns (DATA_DIR/kv): -1 a tenth of the free disk, 0 off
    kv_swa_full: bool = False  # sliding-window layers keep every position, not only their window (more memory)
    rpc_servers: str = ""  # HOST:PORT,...: lmsp rpc-server processes that hold some of each model's layers
    tensor_split: str = ""  # with rpc_servers: shares of this box, then of each server (empty: by free memory)
    rpc_timeout: float = 60.0  # seconds a server may neither send nor take a byte while owing an answer: then lost
    # requests
    max_output_tokens: int = 256  # default for a request that gives none
    max_output_tokens_cap: int = 4096
    default_on_restart: str = "fail"
    max_unfinished_per_client: int = 256  # queued or running tasks a client may have (0: no limit; admins none)
    max_body_bytes: int = 1 << 20
    body_timeout: float = 30.0  # seconds for a whole request body to arrive (408 after)
    lease_seconds: float = 10.0  # a worker's claim on a task, renewed while it runs
    max_attempts: int = 3  # starts of a task whose worker stops while it runs; then attempts_exhausted (LMSP B.12)
    commit_window_ms: float = 25.0  # output gathered this long per commit (first and last events at once)
    heartbeat_seconds: float = 15.0  # SSE comment on an idle stream
    pairing_ttl_seconds: int = 600
    pairing_max_attempts: int = 5
    # server
    workers: int = 1
    log_level: str = "info"
    header_timeout: float = 10.0  # seconds for a new connection's request line and headers
    max_idle_connections: int = 512  # per worker: connections waiting for a request (the oldest closed beyond)
    max_idle_per_address: int = 128  # ... the same, per client address
    stop_grace_seconds: float = 15.0  # a stop lets running tasks finish this long, then ends the streams

    @property
    def db_path(self) -> Path:
        return self.data_dir / "lmsp.db"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def snapshots_dir(self) -> Path:
        return self.data_dir / "snapshots"

    @property
    def kv_dir(self) -> Path:
        return self.data_dir / "kv"

    @property
    def admin_token_path(self) -> Path:
        return self.data_dir / "admin.token"

    @property
    def rpc_server_list(self) -> list[str]:
        """``rpc_servers`` as a list (empty: the models stay on this box)."""
        return split_rpc_servers(self.rpc_servers)

    @property
    def tensor_split_list(self) -> list[float]:
        return [float(x) for x in self.tensor_split.split(",") if x.strip()]

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes).validated()

    def validated(self) -> "Config":
        """This configuration, once every setting is checked (a ValueError names the first bad one)."""
        self._check_choices()
        self._check_numbers()
        self._check_names()
        return self

    def _check_choices(self) -> None:
        if self.durability not in DURABILITY:
            raise ValueError(f"durability must be one of {', '.join(DURABILITY)}, not {self.durability!r}")
        if self.default_on_restart not in RESTART_POLICIES:
            raise ValueError(f"default_on_restart must be one of {', '.join(RESTART_POLICIES)}")
        for name in ("batch_invariant", "prefix_cache", "mmap", "kv_swa_full"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, not {getattr(self, name)!r}")

    def _check_numbers(self) -> None:
        if self.kv_cache_bytes < -1:
            raise ValueError("kv_cache_bytes must be -1 (a share of the free disk), 0 (off) or a number of bytes")
        if self.max_unfinished_per_client < 0:
            raise ValueError("max_unfinished_per_client must be 0 (no limit) or more")
        for name in ("retention_days", "idempotency_ttl_hours"):
            if not 0 <= getattr(self, name) < float("inf"):  # (NaN fails too)
                raise ValueError(f"{name} must be a number, 0 or more")
        if not 0 < self.header_timeout <= 3600:
            raise ValueError("header_timeout must be more than 0 and at most 3600 seconds")
        if not 0 <= self.stop_grace_seconds <= 3600:
            raise ValueError("stop_grace_seconds must be between 0 and 3600")
        if not 0 <= self.commit_window_ms <= 1000:
            raise ValueError("commit_window_ms must be between 0 and 1000")
        for name in (
            "n_ctx",
            "n_parallel",
            "n_batch",
            "max_output_tokens",
            "max_output_tokens_cap",
            "workers",
            "max_idle_connections",
            "max_idle_per_address",
            "max_attempts",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_output_tokens > self.max_output_tokens_cap:
            raise ValueError("max_output_tokens must not exceed max_output_tokens_cap")

    def _check_names(self) -> None:
        if self.log_level.lower() not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}, not {self.log_level!r}")
        if self.box_id and not re.fullmatch(r"[a-z0-9]{1,8}", self.box_id):
            raise ValueError(f"box_id must be 1 to 8 lowercase letters and digits, not {self.box_id!r}")
        try:
            found = parse_peers(self.peers)
        except ValueError as exc:
            raise ValueError(f"peers: {exc}") from None
        if found and not self.box_id:
            raise ValueError("peers need a box_id for this box")
        if self.box_id in found:
            raise ValueError(f"peers: {self.box_id!r} is this box's own id")
        self._check_rpc()
        if not _bind_ok(self.bind):
            raise ValueError(
                f"bind must be HOST:PORT, [IPV6]:PORT or unix:PATH (a port from 0 to 65535), not {self.bind!r}"
            )

    def _check_rpc(self) -> None:
        servers = self.rpc_server_list  # (a ValueError names a bad one)
        try:
            shares = self.tensor_split_list
        except ValueError:
            raise ValueError(f"tensor_split must be numbers separated by commas, not {self.tensor_split!r}") from None
        if shares and len(shares) != len(servers) + 1:
            raise ValueError("tensor_split takes one share for this box, then one for each of rpc_servers")
        if any(not 0 <= x < float("inf") for x in shares) or (shares and sum(shares) <= 0):
            raise ValueError("tensor_split shares must be numbers, 0 or more, not all 0")
        if not 0 < self.rpc_timeout <= 86400:  # (NaN fails too)
            raise ValueError("rpc_timeout must be more than 0 and at most 86400 seconds")
        if servers and self.workers != 1:
            raise ValueError("rpc_servers needs workers = 1: each rpc-server serves one client at a time")


def split_rpc_servers(text: str) -> list[str]:
    """A comma-separated list of ``HOST:PORT`` (``[IPV6]:PORT``) addresses; a ValueError names a bad one."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        address = re.fullmatch(r"(\[[^\]]+\]|[^:\[\]\s]+):([0-9]{1,5})", part)
        if address is None or not 0 < int(address.group(2)) <= 65535:
            raise ValueError(f"rpc_servers: {part!r} is not HOST:PORT")
        if part in out:
            raise ValueError(f"rpc_servers: {part} is named twice")
        out.append(part)
    return out


def _bind_ok(bind: str) -> bool:
    """``bind`` is an address gunicorn takes (``unix:PATH``, ``fd://N``, ``[tcp://]HOST:PORT``),
    with its port stated (gunicorn would take a bare word as a host name on port 8000)."""
    if re.match(r"unix:(//)?", bind):
        return bool(re.split(r"unix:(//)?", bind)[-1])
    if bind.startswith("fd://"):
        return re.fullmatch(r"[0-9]+", bind[5:]) is not None
    address = re.fullmatch(r"(\[[^\]]+\]|[^:\[\]]*):([0-9]{1,5})", bind.removeprefix("tcp://"))
    return address is not None and int(address.group(2)) <= 65535


def parse_peers(text: str) -> dict[str, str]:
    """``"ID=HOST:PORT,..."`` as ``{box id: "HOST:PORT"}`` (a ValueError names a bad entry)."""
    out: dict[str, str] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        box, _, address = entry.partition("=")
        if not re.fullmatch(r"[a-z0-9]{1,8}", box) or not re.fullmatch(r"[A-Za-z0-9.\-]+:[0-9]{1,5}", address):
            raise ValueError(f"each peer is ID=HOST:PORT (ID: 1 to 8 of a-z 0-9), not {entry!r}")
        if box in out:
            raise ValueError(f"box {box!r} is named twice")
        out[box] = address
    return out


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _coerce(f: dataclasses.Field, raw, source: str | None = None):
    """``raw`` as the field's type; a value that is not one is refused, naming the setting
    and where it came from (``source``: the file or the environment variable)."""
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if raw is None:
        return None
    where = f"{source}: " if source else ""
    if kind.startswith("str") and isinstance(raw, list):  # a TOML list of a comma-separated setting
        return ",".join(str(x) for x in raw)
    if kind.startswith("bool"):
        if isinstance(raw, bool):
            return raw
        word = str(raw).strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise ValueError(f"{where}{f.name} must be true or false, not {raw!r}")
    if "Path" in kind:
        if not isinstance(raw, (str, os.PathLike)):
            raise ValueError(f"{where}{f.name} must be a path, not {raw!r}")
        return Path(raw)
    if kind.startswith("int") or kind.startswith("float"):
        whole = kind.startswith("int")
        try:
            if isinstance(raw, bool) or (whole and isinstance(raw, float)):
                raise ValueError
            return int(raw) if whole else float(raw)
        except (TypeError, ValueError):
            raise ValueError(
                f"{where}{f.name} must be {'a whole number' if whole else 'a number'}, not {raw!r}"
            ) from None
    return str(raw)


def load(env: dict[str, str] | None = None, **overrides) -> Config:
    """Build the configuration from defaults, file, environment and overrides."""
    env = dict(os.environ if env is None else env)
    known = {f.name: f for f in fields(Config)}
    values: dict = {}
    data_dir = overrides.get("data_dir") or env.get("LMSP_DATA_DIR") or Config.data_dir
    path = Path(env.get("LMSP_CONFIG") or Path(data_dir) / "lmsp.toml")
    if env.get("LMSP_CONFIG") and not path.is_file():
        raise ValueError(f"LMSP_CONFIG: no such file: {path}")
    if path.is_file():
        with path.open("rb") as fh:
            try:
                table = tomllib.load(fh)
            except tomllib.TOMLDecodeError as exc:
                raise ValueError(f"{path}: {exc}") from None
        for key, raw in table.items():
            if key not in known:
                raise ValueError(f"{path}: unknown setting {key!r}")
            values[key] = _coerce(known[key], raw, str(path))
    for name, f in known.items():
        raw = env.get(f"LMSP_{name.upper()}")
        if raw not in (None, ""):
            values[name] = _coerce(f, raw, f"LMSP_{name.upper()}")
    for name, raw in overrides.items():
        if raw is not None:
            values[name] = _coerce(known[name], raw)
    return Config(**values).validated()
