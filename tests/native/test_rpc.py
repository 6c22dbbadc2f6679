"""A model split over two ``lmsp rpc-server`` processes on loopback (ggml's RPC
backend) computes what the engine computes alone on this box: the same greedy
and sampled tokens, text and log probabilities, alone and batched, for short
prompts (one-row steps) and long ones (tiled steps), and a snapshot resumed
without its KV continues the same. Then the refusals: a server that does not
answer, one of another protocol version, a public bind without --allow-public."""
from __future__ import annotations

import subprocess

import pytest
from native_helpers import CATALOG_MODELS, SAMPLING_CASES, N_GPU_LAYERS, Run, drain, generate
from rpc_servers import OtherVersionServer, RpcServer, free_port, lmsp_command

from lmsp import native
from lmsp.native import Engine

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(N_GPU_LAYERS != 0, reason="exactness needs the batch-invariant CPU backend"),
]

MODELS, CASES = CATALOG_MODELS, SAMPLING_CASES
PROMPTS = [
    [{"role": "user", "content": "Write three sentences about the sea."}],
    [{"role": "user", "content": "Hi"}],
    # longer than a tiled chunk: prefilled in tiled steps while the others decode
    [{"role": "user", "content": "Summarise this. " + "The river runs to the sea, and the sea is wide. " * 12}],
]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    started = [RpcServer(tmp_path_factory.mktemp("rpc")).start() for _ in range(2)]
    yield [s.address for s in started]
    for s in started:
        assert s.stop() == 0, s.log()


@pytest.fixture(scope="module", params=MODELS)
def model_path(request, catalog_model):
    return catalog_model(request.param)


@pytest.fixture
def make(model_path):
    made: list[Engine] = []

    def build(**kwargs) -> Engine:
        engine = Engine(str(model_path), n_ctx=2048, n_parallel=4, n_threads=1, **kwargs)
        made.append(engine)
        return engine

    yield build
    for engine in made:
        engine.close()
    made.clear()  # the model goes with the object: its buffers on the servers are freed now, while they run


def batched(engine: Engine, params: dict, max_tokens: int = 24) -> list[Run]:
    seqs = [engine.submit(engine.chat_prompt(m), max_tokens=max_tokens, logprobs=True, **params) for m in PROMPTS]
    runs = drain(engine, seqs)
    return [runs[s] for s in seqs]


@pytest.mark.parametrize("case", list(CASES))
def test_the_split_model_gives_the_local_engine_s_tokens_and_log_probabilities(make, servers, case):
    params = CASES[case]
    local = batched(make(), params)
    split_engine = make(rpc_servers=servers)
    split = batched(split_engine, params)
    for want, got in zip(local, split):
        assert want.tokens, "the model answered nothing"
        assert (got.tokens, got.text) == (want.tokens, want.text)
        assert got.logprobs == want.logprobs  # bitwise: the same logits
    alone = generate(split_engine, split_engine.chat_prompt(PROMPTS[0]), max_tokens=24, logprobs=True, **params)
    assert (alone.tokens, alone.logprobs) == (local[0].tokens, local[0].logprobs)


def test_the_layers_go_to_this_box_first_then_to_each_server_by_the_split(make, servers, model_path):
    engine = make(rpc_servers=servers, tensor_split=[2, 1, 1])
    layers = engine.info["layers"]
    n_layer = native.read_gguf_info(str(model_path))["n_layer"]
    assert len(layers) == n_layer + 1  # the output layer last: its matrix stays on this box
    repeating, output = layers[:-1], layers[-1]
    assert output == "cpu"
    assert repeating == sorted(repeating, key=["cpu", *servers].index)
    counts = [repeating.count(place) for place in ["cpu", *servers]]
    assert abs(counts[0] - (n_layer + 1) / 2) <= 1 and min(counts) >= 1
    assert make().info["layers"] == ["cpu"] * (n_layer + 1)


def test_a_snapshot_resumed_without_kv_in_a_split_model_continues_the_local_output(make, servers):
    params = CASES["sampled"]
    local = make()
    prompt = local.chat_prompt(PROMPTS[0])
    full = generate(local, prompt, max_tokens=40, **params)
    seq = local.submit(prompt, max_tokens=40, **params)
    run = Run()
    while len(run.tokens) < 12:
        local.wait(60)
        for result in local.poll():
            run.tokens += result["tokens"]
    snap = local.snapshot(seq, with_kv=False)
    local.cancel(seq)
    drain(local, [seq])
    split = make(rpc_servers=servers)
    resumed = generate(split, prompt, max_tokens=40, resume=snap, **params)
    assert snap["generated"] + resumed.tokens == full.tokens


def test_two_engines_of_one_process_share_each_server(make, servers):
    # a server serves one client at a time: the second engine rides the first one's connection
    first, second = make(rpc_servers=servers), make(rpc_servers=servers)
    prompt = first.chat_prompt(PROMPTS[1])
    assert generate(first, prompt, max_tokens=8, temperature=0).tokens == \
        generate(second, prompt, max_tokens=8, temperature=0).tokens


def test_a_server_that_does_not_answer_is_refused_naming_its_address(model_path, servers):
    silent = f"127.0.0.1:{free_port()}"
    with pytest.raises(native.RpcUnreachableError, match=silent.replace(".", r"\.")):
        Engine(str(model_path), n_threads=1, rpc_servers=[servers[0], silent])


def test_a_server_of_another_protocol_version_is_refused(model_path):
    other = OtherVersionServer((int(native.rpc_protocol().split(".")[0]) - 1, 0, 0))
    try:
        with pytest.raises(native.RpcUnreachableError, match="speaks protocol") as caught:
            Engine(str(model_path), n_threads=1, rpc_servers=[other.address])
        assert other.address in str(caught.value)
    finally:
        other.close()


def test_rpc_server_refuses_a_public_address_without_allow_public():
    done = subprocess.run([*lmsp_command(), "rpc-server", "--bind", "0.0.0.0:1"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert "--allow-public" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_rpc_server_stops_cleanly_on_sigterm(tmp_path):
    server = RpcServer(tmp_path).start()
    assert server.stop() == 0
    assert "stopped (SIGTERM)" in server.log_path.read_text()
