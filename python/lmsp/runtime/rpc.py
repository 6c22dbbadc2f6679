"""The RPC servers this worker splits its models over (``rpc_servers``), as it sees them,
and the server end for ``lmsp rpc-server`` (:func:`serve`).

Each server is ``connected`` while an engine of this worker holds layers on it,
``unreachable`` after a load found it silent or speaking another protocol
version (with that error), and ``idle`` otherwise (named, not in use: a
server serves one client at a time, so it is not greeted while idle). A
loaded engine's ``info["layers"]`` names each layer's place; :func:`placement`
folds them into runs for the Model object.
"""

from __future__ import annotations

import re
from typing import Any

from ..config import split_rpc_servers
from ..errors import InvalidRequest
from ._threads import allocate_lock

CONNECTED, UNREACHABLE, IDLE = "connected", "unreachable", "idle"
# the error code of a sequence whose engine lost an RPC server while it ran (native.BACKEND_LOST)
BACKEND_LOST = "backend_lost"


def server_built() -> bool:
    """Whether the extension has ggml's RPC backend (CMake option LMSP_RPC)."""
    from .. import native

    return bool(native.RPC_BUILT)


def protocol() -> str:
    """The RPC protocol version the extension speaks."""
    from .. import native

    return str(native.rpc_protocol())


def serve(endpoint: str, *, cache_dir: str, n_threads: int, mem_bytes: int) -> None:
    """ggml's RPC server on ``endpoint`` over this box's CPU, with the engine's kernels;
    returns only by raising (it cannot listen)."""
    from .. import native

    native.rpc_serve(endpoint, cache_dir=cache_dir, n_threads=n_threads, mem_bytes=mem_bytes)


def placement(layers: Any) -> list[dict[str, Any]] | None:
    """Runs of consecutive layers on one place (``cpu`` or a server's HOST:PORT):
    ``{"place", "first", "count"}``, the output layer counted last (index n_layer);
    None without a list of places."""
    if not isinstance(layers, list) or not layers:
        return None
    runs: list[dict[str, Any]] = []
    for index, place in enumerate(layers):
        if runs and runs[-1]["place"] == place:
            runs[-1]["count"] += 1
        else:
            runs.append({"place": str(place), "first": index, "count": 1})
    return runs


def model_split(servers: list[str] | None, shares: list[float] | None, workers: int) -> dict[str, Any] | None:
    """A model's own RPC split as the store keeps it (``{"servers", "tensor_split"}``; None:
    the service's setting), checked as the settings are; an InvalidRequest names the field."""
    if not servers:
        if shares:
            raise InvalidRequest("tensor_split needs rpc_servers", param="tensor_split")
        return None
    try:
        listed = split_rpc_servers(",".join(servers))
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="rpc_servers") from None
    if len(listed) != len(servers):
        raise InvalidRequest("rpc_servers: an address is empty", param="rpc_servers")
    if shares and (len(shares) != len(listed) + 1 or min(shares) < 0 or sum(shares) <= 0):
        raise InvalidRequest(
            "tensor_split takes one share (0 or more) for this box, then one for each of rpc_servers, not all 0",
            param="tensor_split",
        )
    if workers != 1:
        raise InvalidRequest("rpc_servers needs the service's workers = 1", param="rpc_servers")
    return {"servers": listed, "tensor_split": [float(x) for x in shares or ()]}


def named_address(message: str, servers: list[str]) -> str | None:
    """The configured server an engine's error names (None: none of them)."""
    for address in servers:
        if re.search(rf"(?<![\w.:\[]){re.escape(address)}(?![\w])", message):
            return address
    return None


class RpcServers:
    """The servers this worker's models are split over and their states; safe from any thread."""

    def __init__(self, servers: list[str]) -> None:
        self.servers = list(servers)  # the service's setting; a model may name its own
        self._lock = allocate_lock()
        self._known: list[str] = list(servers)  # every server named so far, in order
        self._errors: dict[str, str] = {}  # address -> why it was unreachable at the last load
        self._layers: dict[str, dict[str, int]] = {}  # model id -> address -> layers held there

    def _know(self, servers: list[str]) -> None:
        self._known += [s for s in servers if s not in self._known]

    def loaded(self, model_id: str, servers: list[str], layers: Any) -> None:
        counts: dict[str, int] = {}
        for place in layers if isinstance(layers, list) else []:
            if place in servers:
                counts[place] = counts.get(place, 0) + 1
        with self._lock:
            self._know(servers)
            self._layers[model_id] = counts
            for address in counts:
                self._errors.pop(address, None)

    def unloaded(self, model_id: str) -> None:
        with self._lock:
            self._layers.pop(model_id, None)

    def unreachable(self, message: str, servers: list[str]) -> str | None:
        """Records a load's refusal by one of ``servers``; returns its address (None when
        the message names none of them)."""
        address = named_address(message, servers)
        with self._lock:
            self._know(servers)
            if address is not None:
                self._errors[address] = message
        return address

    def states(self, servers: list[str] | None = None, model_id: str | None = None) -> list[dict[str, Any]]:
        """Each of ``servers`` (every one named so far when None): ``{"address", "state",
        "layers", "error"}``, with the layers the model holds there (all models' when
        ``model_id`` is None)."""
        out = []
        with self._lock:
            for address in self._known if servers is None else servers:
                held = [n.get(address, 0) for m, n in self._layers.items() if model_id in (None, m)]
                in_use = any(address in n for n in self._layers.values())
                error = self._errors.get(address)
                state = CONNECTED if in_use else UNREACHABLE if error else IDLE
                out.append({"address": address, "state": state, "layers": sum(held), "error": error})
        return out

    def figures(self) -> dict[str, dict[str, int]]:
        """For /metrics: each server's state (1 connected, 0 unreachable or idle) and
        the layers this worker's models hold on it."""
        states = self.states()
        return {
            "rpc_server_connected": {s["address"]: int(s["state"] == CONNECTED) for s in states},
            "rpc_server_unreachable": {s["address"]: int(s["state"] == UNREACHABLE) for s in states},
            "rpc_server_layers": {s["address"]: s["layers"] for s in states},
        }
