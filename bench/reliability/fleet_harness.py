"""A fleet on loopback for the tests and bench/fleet.py: boxes started with ``lmsp serve``
(box ids, peers and one fleet key), and nginx run from what ``lmsp fleet nginx`` prints."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from rel_harness import Client, Server, free_port, stop_process

BOXES = ("a", "b", "c")
WRITE = ["responses:write", "responses:read", "models:read"]


class Fleet:
    """Boxes ``a``, ``b``, ``c`` on loopback ports, each naming the others as peers."""

    def __init__(self, root: Path, boxes: tuple[str, ...] = BOXES, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.env = {"LMSP_N_PARALLEL": "2", **(env or {})}
        self.ports = {box: free_port() for box in boxes}
        self.servers: dict[str, Server] = {}
        self.port = 0  # the router of every box, once started
        self.routers: list[subprocess.Popen] = []

    def start(self) -> None:
        for box in self.ports:
            data = self.root / box
            data.mkdir(parents=True)
            peers = ",".join(f"{other}=127.0.0.1:{port}" for other, port in self.ports.items() if other != box)
            (data / "lmsp.toml").write_text(f'box_id = "{box}"\npeers = "{peers}"\n')
            server = Server(data, log=self.root / f"{box}.log", port=self.ports[box], env=self.env)
            self.servers[box] = server
        first = next(iter(self.servers.values()))
        assert first.cli("fleet", "init", "--data-dir", str(first.data_dir)).returncode == 0
        for box in list(self.ports)[1:]:
            done = first.cli("fleet", "join", "--data-dir", str(self.servers[box].data_dir),
                             "--key", str(first.data_dir / "fleet.key"))
            assert done.returncode == 0, done.stderr
        assert (first.data_dir / "fleet.key").stat().st_mode & 0o777 == 0o600
        for server in self.servers.values():
            server.start(wait=False)
        for server in self.servers.values():
            server.wait_ready()
        self.port = self.start_nginx(list(self.ports))

    def start_nginx(self, boxes: list[str], port: int | None = None) -> int:
        """nginx for ``boxes`` (of this fleet), from ``lmsp fleet nginx``, run with
        ``nginx -p DIR -c FILE``; its port once it listens."""
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(binary).exists():
            raise RuntimeError("nginx is not installed (scripts/dev test installs it where it can)")
        port = port or free_port()
        named = [f"--box={box}=127.0.0.1:{self.ports[box]}" for box in boxes]
        made = next(iter(self.servers.values())).cli("fleet", "nginx", "--listen", f"127.0.0.1:{port}", *named)
        if made.returncode != 0:
            raise RuntimeError(f"lmsp fleet nginx failed: {made.stderr}")
        prefix = self.root / f"nginx-{port}"
        prefix.mkdir(parents=True, exist_ok=True)
        (prefix / "nginx.conf").write_text(made.stdout)
        proc = subprocess.Popen([binary, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-g", "daemon off;"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        self.routers.append(proc)
        deadline = time.monotonic() + 30
        while not _listening(port):
            if proc.poll() is not None:
                raise RuntimeError((prefix / "error.log").read_text(errors="replace"))
            if time.monotonic() > deadline:
                raise RuntimeError("nginx did not listen within 30 s")
            time.sleep(0.05)
        return port

    def stop(self) -> None:
        for proc in self.routers:
            stop_process(proc)
        for server in self.servers.values():
            server.stop()

    def pair(self, box: str, name: str) -> Client:
        """A client paired once: the code made on ``box``, redeemed through nginx."""
        code = self.servers[box].pairing_code(WRITE)
        assert code.startswith(f"{box}.")  # the box that holds the code, for the redeeming box
        got = Client("127.0.0.1", self.port).post("/v1/pair", {"code": code, "client_name": name})
        assert got.status == 201, got.body
        assert owner(got.body["client_id"]) == box
        return Client("127.0.0.1", self.port, got.body["token"], 60.0, got.body["client_id"], WRITE)

    def router(self, client: Client) -> Client:
        """``client`` (paired on a box) as it calls the fleet's one address."""
        return Client("127.0.0.1", self.port, client.token, 60.0, client.client_id, client.scopes)

    def direct(self, client: Client, box: str) -> Client:
        return Client("127.0.0.1", self.ports[box], client.token, 60.0, client.client_id, client.scopes)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def owner(any_id: str) -> str:
    """The box in an id (the regular expression of docs/API.md, "A fleet of boxes")."""
    import re

    found = re.match(r"^[a-z]+[_-]([a-z0-9]{1,8})_[0-9A-HJKMNP-TV-Z]{26}", any_id)
    assert found is not None, any_id
    return found.group(1)
