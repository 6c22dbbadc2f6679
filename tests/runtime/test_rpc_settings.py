"""The settings and bookkeeping of models split over RPC servers, without a model:
``rpc_servers``, ``tensor_split`` and ``rpc_timeout`` checked at load, the addresses ``lmsp
rpc-server`` calls public, the layer runs of a Model object, each server's
state as a worker sees it, and a load refused by a server."""
from __future__ import annotations

import pytest

from lmsp import config, native
from lmsp.cli.rpc_server import public_addresses
from lmsp.errors import ModelLoadFailed
from lmsp.runtime.rpc import RpcServers, named_address, placement


def test_rpc_servers_and_tensor_split_are_read_and_checked():
    cfg = config.load({"LMSP_RPC_SERVERS": "10.0.0.2:50052, [fd00::2]:50052", "LMSP_TENSOR_SPLIT": "2,1,1"})
    assert cfg.rpc_server_list == ["10.0.0.2:50052", "[fd00::2]:50052"]
    assert cfg.tensor_split_list == [2.0, 1.0, 1.0]
    assert config.load({}).rpc_server_list == []
    assert (config.load({}).rpc_timeout, config.load({"LMSP_RPC_TIMEOUT": "2.5"}).rpc_timeout) == (60.0, 2.5)
    for env, message in [
        ({"LMSP_RPC_SERVERS": "10.0.0.2"}, "not HOST:PORT"),
        ({"LMSP_RPC_SERVERS": "a:1,a:1"}, "named twice"),
        ({"LMSP_RPC_SERVERS": "a:1", "LMSP_TENSOR_SPLIT": "1"}, "one share for this box"),
        ({"LMSP_RPC_SERVERS": "a:1", "LMSP_TENSOR_SPLIT": "0,0"}, "not all 0"),
        ({"LMSP_RPC_SERVERS": "a:1", "LMSP_TENSOR_SPLIT": "x,1"}, "numbers separated by commas"),
        ({"LMSP_RPC_SERVERS": "a:1", "LMSP_WORKERS": "2"}, "workers = 1"),
        ({"LMSP_RPC_TIMEOUT": "0"}, "rpc_timeout must be more than 0"),
        ({"LMSP_RPC_TIMEOUT": "nan"}, "rpc_timeout must be more than 0"),
        ({"LMSP_RPC_TIMEOUT": "86401"}, "at most 86400"),
        ({"LMSP_RPC_TIMEOUT": "soon"}, "rpc_timeout must be a number"),
    ]:
        with pytest.raises(ValueError, match=message):
            config.load(env)


def test_a_toml_list_of_servers_is_taken(tmp_path):
    (tmp_path / "lmsp.toml").write_text('rpc_servers = ["10.0.0.2:50052", "10.0.0.3:50052"]\n')
    assert config.load({"LMSP_DATA_DIR": str(tmp_path)}).rpc_server_list == ["10.0.0.2:50052", "10.0.0.3:50052"]


@pytest.mark.parametrize("host, public", [
    ("127.0.0.1", False), ("localhost", False), ("10.1.2.3", False), ("192.168.1.9", False),
    ("100.64.0.7", False), ("fd00::2", False), ("0.0.0.0", True), ("::", True), ("8.8.8.8", True),
])
def test_rpc_server_calls_global_and_unspecified_addresses_public(host, public):
    assert bool(public_addresses(host)) is public


def test_layer_places_fold_into_runs():
    assert placement(["cpu", "cpu", "a:1", "a:1", "b:2"]) == [
        {"place": "cpu", "first": 0, "count": 2},
        {"place": "a:1", "first": 2, "count": 2},
        {"place": "b:2", "first": 4, "count": 1},
    ]
    assert placement(None) is None and placement([]) is None


def test_each_server_s_state_follows_loads_and_refusals():
    named = ["127.0.0.1:1", "127.0.0.1:10"]
    servers = RpcServers(named)
    assert [s["state"] for s in servers.states()] == ["idle", "idle"]
    message = "RPC server 127.0.0.1:10 does not answer: Connection refused"
    assert named_address(message, named) == "127.0.0.1:10"  # not 127.0.0.1:1
    assert servers.unreachable(message, named) == "127.0.0.1:10"
    servers.loaded("m", named, ["cpu", "127.0.0.1:1", "127.0.0.1:1"])
    assert servers.states(named, "m") == [
        {"address": "127.0.0.1:1", "state": "connected", "layers": 2, "error": None},
        {"address": "127.0.0.1:10", "state": "unreachable", "layers": 0, "error": message},
    ]
    servers.loaded("own", ["10.0.0.9:5"], ["cpu", "10.0.0.9:5"])  # a model with servers of its own
    assert servers.figures()["rpc_server_connected"] == {"127.0.0.1:1": 1, "127.0.0.1:10": 0, "10.0.0.9:5": 1}
    servers.unloaded("m")
    assert servers.states()[0]["state"] == "idle"


def refusing(path, **kwargs):
    raise native.RpcUnreachableError(f"RPC server {kwargs['rpc_servers'][-1]} does not answer: Connection refused")


def test_a_load_refused_by_a_server_leaves_the_model_unavailable_naming_it(config, store, model_file):
    from lmsp.runtime.registry import ModelRegistry

    registry = ModelRegistry(config.replace(rpc_servers="127.0.0.1:9"), store, engine_factory=refusing)
    registry.register("tiny.gguf")
    with pytest.raises(ModelLoadFailed, match="127.0.0.1:9") as caught:
        registry.load("tiny")
    assert (caught.value.status, caught.value.code) == (503, "unavailable")
    model = registry.object("tiny")
    assert model["state"] == "unavailable"
    assert model["rpc_servers"][0]["state"] == "unreachable"


def test_a_model_registered_with_servers_of_its_own_is_split_over_them(config, store, model_file):
    from lmsp.runtime.registry import ModelRegistry

    seen = []

    def factory(path, **kwargs):
        seen.append((kwargs.get("rpc_servers"), kwargs.get("tensor_split"), kwargs.get("rpc_timeout")))
        return refusing(path, **kwargs)

    registry = ModelRegistry(config.replace(rpc_servers="127.0.0.1:9", rpc_timeout=5), store, engine_factory=factory)
    shown = registry.register("tiny.gguf", "own", rpc_servers=["127.0.0.1:7", "127.0.0.1:8"],
                              tensor_split=[1, 1, 2])
    assert [s["address"] for s in shown["rpc_servers"]] == ["127.0.0.1:7", "127.0.0.1:8"]
    assert "rpc_split" not in shown and "path" not in shown
    registry.register("tiny.gguf", "shared")
    for model_id in ("own", "shared"):
        with pytest.raises(ModelLoadFailed):
            registry.load(model_id)
    assert seen == [(["127.0.0.1:7", "127.0.0.1:8"], [1.0, 1.0, 2.0], 5.0), (["127.0.0.1:9"], [], 5.0)]
    assert registry.object("own")["rpc_servers"][1]["state"] == "unreachable"


@pytest.mark.parametrize("servers, shares, param", [
    (["nowhere"], None, "rpc_servers"),
    (["a:1", "a:1"], None, "rpc_servers"),
    (["a:1"], [1], "tensor_split"),
    (None, [1, 1], "tensor_split"),
])
def test_a_bad_split_is_refused_naming_its_field(config, store, model_file, servers, shares, param):
    from lmsp.errors import InvalidRequest
    from lmsp.runtime.registry import ModelRegistry

    with pytest.raises(InvalidRequest) as caught:
        ModelRegistry(config, store).register("tiny.gguf", rpc_servers=servers, tensor_split=shares)
    assert caught.value.param == param
