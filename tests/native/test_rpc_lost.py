"""An RPC server lost while a split model runs: ggml's client talks to it through
a relay of this process (csrc/rpc_relay.cpp), so the process lives on. The
running sequence ends with ``backend_lost`` naming the server, the engine
refuses more work with BackendLostError and closes; once the server is back, a
new engine loads and computes what the engine computes alone on this box. A
server stopped mid-decode (SIGSTOP: its kernel still acknowledges) is lost the
same way once it has not answered for ``rpc_timeout`` seconds. And the relay
alone, against a fake server that dies mid-answer."""

from __future__ import annotations

import os
import signal
import socket

import pytest
from native_helpers import N_GPU_LAYERS, drain, generate, take
from rpc_servers import FakeServer, RpcServer, greeting

from lmsp import native
from lmsp.native import Engine

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(N_GPU_LAYERS != 0, reason="exactness needs the batch-invariant CPU backend"),
]

MESSAGES = [{"role": "user", "content": "Write a long story about the sea."}]


@pytest.fixture
def model_path(catalog_model):
    return catalog_model("smollm2-135m-instruct")


def test_a_server_killed_mid_decode_fails_the_sequence_and_the_model_loads_again_once_it_is_back(model_path, tmp_path):
    servers = [RpcServer(tmp_path).start() for _ in range(2)]
    addresses = [s.address for s in servers]
    local = Engine(str(model_path), n_ctx=1024, n_parallel=2, n_threads=1)
    prompt = local.chat_prompt(MESSAGES)
    want = generate(local, prompt, max_tokens=16, temperature=0).tokens
    local.close()

    split = Engine(str(model_path), n_ctx=1024, n_parallel=2, n_threads=1, rpc_servers=addresses)
    assert set(split.info["layers"]) >= set(addresses)  # the servers' addresses, not their relays'
    seq = split.submit(prompt, max_tokens=900, temperature=0)
    take(split, 4)
    servers[1].kill()
    run = drain(split, [seq])[seq]
    last = run.results[-1]
    assert (last["finish"], last["code"]) == ("error", "backend_lost")
    assert addresses[1] in last["error"] and "lost" in last["error"]
    assert addresses[1] in split.backend_lost
    with pytest.raises(native.BackendLostError, match=addresses[1].replace(".", r"\.")):
        split.submit(prompt, max_tokens=4)
    split.close()  # its buffers on the lost server are freed through the relay's own answers
    del split

    with pytest.raises(native.RpcUnreachableError, match=addresses[1].replace(".", r"\.")):
        Engine(str(model_path), n_threads=1, rpc_servers=addresses)
    servers[1] = RpcServer(tmp_path, port=servers[1].port).start()
    again = Engine(str(model_path), n_ctx=1024, n_parallel=2, n_threads=1, rpc_servers=addresses)
    assert again.backend_lost == ""
    assert generate(again, prompt, max_tokens=16, temperature=0).tokens == want
    again.close()
    del again
    for server in servers:
        assert server.stop() == 0, server.log()


def test_a_server_stopped_mid_decode_is_lost_after_the_answer_timeout_and_the_model_loads_once_it_runs(
    model_path, tmp_path
):
    server = RpcServer(tmp_path).start()
    local = Engine(str(model_path), n_ctx=1024, n_parallel=2, n_threads=1)
    prompt = local.chat_prompt(MESSAGES)
    want = generate(local, prompt, max_tokens=16, temperature=0).tokens
    local.close()
    with pytest.raises(ValueError, match="rpc_timeout"):
        Engine(str(model_path), n_threads=1, rpc_servers=[server.address], rpc_timeout=0)

    split = Engine(
        str(model_path), n_ctx=1024, n_parallel=2, n_threads=1, rpc_servers=[server.address], rpc_timeout=4
    )  # well over a step of a loaded machine
    seq = split.submit(prompt, max_tokens=900, temperature=0)
    take(split, 4)
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        last = drain(split, [seq])[seq].results[-1]
        assert (last["finish"], last["code"]) == ("error", "backend_lost")
        assert f"RPC server {server.address} lost: no answer for 4 s" in last["error"]
        assert "no answer" in split.backend_lost
        with pytest.raises(native.BackendLostError, match=server.address.replace(".", r"\.")):
            split.submit(prompt, max_tokens=4)
        split.close()
        del split
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)  # it runs again and sees the relay's connection closed
    again = Engine(str(model_path), n_ctx=1024, n_parallel=2, n_threads=1, rpc_servers=[server.address])
    assert again.backend_lost == ""
    assert generate(again, prompt, max_tokens=16, temperature=0).tokens == want
    again.close()
    del again
    assert server.stop() == 0, server.log()


class DyingServer(FakeServer):
    """Greets like an RPC server, then answers the next command with its size and
    half of its bytes, and closes the connection."""

    def answer(self, conn: socket.socket) -> None:
        if len(conn.recv(1 + 8 + 24)) < 9:
            return
        conn.sendall(greeting([int(x) for x in native.rpc_protocol().split(".")]))
        if conn.recv(9):  # DEVICE_COUNT, no payload
            conn.sendall((4).to_bytes(8, "little") + b"\x01\x00")  # half of its uint32, then gone


def test_a_server_that_dies_mid_answer_is_refused_naming_it_and_the_process_lives_on(model_path):
    server = DyingServer()
    try:
        with pytest.raises(native.RpcUnreachableError, match=server.address.replace(".", r"\.")) as caught:
            Engine(str(model_path), n_threads=1, rpc_servers=[server.address])
        assert "lost" in str(caught.value)
    finally:
        server.close()
