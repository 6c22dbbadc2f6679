"""``lmsp serve --rpc`` with SmolLM2 split over two ``lmsp rpc-server`` processes
on loopback answers as the service does with the model on one box: plain,
chat, tool and structured requests, streamed deltas and log probabilities,
token for token; a ``resume`` task killed with SIGKILL continues to the
uninterrupted text. The model shows where its layers are, /metrics each
server's state; a server that does not answer leaves the model
``unavailable`` with an error naming its address. A server killed
mid-generation fails a ``fail`` task with ``backend_lost``, and holds a
``resume`` one and requeues a ``retry`` one until the model loads again, in the
same worker: each then completes with the uninterrupted text."""
from __future__ import annotations

import pytest
from e2e_helpers import FINISHED, deltas, resumed_text, sse_events, start_running, uninterrupted_text
from rpc_servers import RpcServer, free_port
from test_function_tools import WEATHER
from test_real_model import INSTRUCTIONS, MODEL, STORY, real_server
from test_structured_output import ABOUT_JOHN, PERSON, schema_format

pytestmark = pytest.mark.real_model

REQUESTS = {
    "plain": {"input": "What is the capital of France?", "temperature": 0, "max_output_tokens": 24},
    "long": {"input": "Summarise this. " + "The river runs to the sea, and the sea is wide. " * 12,
             "temperature": 0, "max_output_tokens": 24},
    "sampled": {"input": "Name three colours.", "seed": 7, "max_output_tokens": 24,
                "include": ["message.output_text.logprobs"], "top_logprobs": 2},
    "tool": {"input": "What is the weather in Paris?", "tools": [WEATHER], "tool_choice": "required",
             "temperature": 0, "max_output_tokens": 80},
    "structured": {"input": ABOUT_JOHN, "seed": 2, "temperature": 1.0, "max_output_tokens": 80,
                   "text": schema_format(PERSON)},
}


@pytest.fixture(scope="module")
def rpc(tmp_path_factory):
    servers = [RpcServer(tmp_path_factory.mktemp("rpc")).start() for _ in range(2)]
    yield servers
    for s in servers:
        if s.proc is not None:
            s.stop()


@pytest.fixture(scope="module")
def pair(tmp_path_factory, smollm2_path, rpc):
    """(local, split): SmolLM2 on this box alone, and split over the two servers."""
    local = real_server(tmp_path_factory.mktemp("local")).start(timeout=180)
    split = real_server(tmp_path_factory.mktemp("split"),
                        LMSP_RPC_SERVERS=",".join(s.address for s in rpc)).start(timeout=180)
    yield local, split
    for served in (local, split):
        served.stop(timeout=10)


TOKENS: dict[int, str] = {}


def token_of(server) -> str:
    if server.port not in TOKENS:
        TOKENS[server.port] = server.pair()
    return TOKENS[server.port]


def answer(server, body: dict, path: str = "/v1/responses") -> dict:
    if path == "/v1/responses":
        body = {"instructions": INSTRUCTIONS, **body}
    return server.call("POST", path, {"model": MODEL, **body}, token=token_of(server))


def same_output(response: dict) -> list:
    return [response["status"], response["output"], response["usage"]["output_tokens"]]


@pytest.mark.parametrize("kind", list(REQUESTS))
def test_the_split_service_answers_as_the_local_one(pair, kind):
    local, split = pair
    want, got = answer(local, REQUESTS[kind]), answer(split, REQUESTS[kind])
    assert want["status"] in ("completed", "incomplete")
    for item in want["output"] + got["output"]:  # the service's ids differ; the model's output must not
        item.pop("id", None)
        item.pop("call_id", None)
        for part in item.get("content", []):
            part.pop("id", None)
    assert same_output(got) == same_output(want)


def test_a_chat_completion_with_logprobs_of_the_split_service_is_the_local_one(pair):
    local, split = pair
    body = {"messages": [{"role": "user", "content": "Name a fruit."}], "seed": 3, "max_tokens": 16,
            "logprobs": True, "top_logprobs": 3}
    want, got = (answer(s, body, "/v1/chat/completions") for s in pair)
    assert got["choices"] == want["choices"] and want["choices"][0]["logprobs"]["content"]


def test_streamed_deltas_of_the_split_service_make_the_local_answer(pair):
    local, split = pair
    body = {"model": MODEL, "instructions": INSTRUCTIONS, **REQUESTS["sampled"], "stream": True}
    events = list(sse_events("127.0.0.1", split.port, "POST", "/v1/responses", token=token_of(split), body=body,
                             timeout=120))
    want = answer(local, REQUESTS["sampled"])
    assert deltas(events) == want["output"][0]["content"][0]["text"]


def test_the_model_shows_its_layers_on_each_server_and_metrics_their_state(pair, rpc):
    _, split = pair
    answer(split, REQUESTS["plain"])  # loaded
    model = split.call("GET", f"/v1/models/{MODEL}", token=token_of(split))
    places = [run["place"] for run in model["layers"]]
    assert places == ["cpu", rpc[0].address, rpc[1].address, "cpu"]  # the output matrix stays here
    assert model["layers"][-1]["count"] == 1
    assert [(s["address"], s["state"]) for s in model["rpc_servers"]] == [(s.address, "connected") for s in rpc]
    here = sum(run["count"] for run in model["layers"] if run["place"] == "cpu")
    assert sum(run["count"] for run in model["layers"]) == sum(s["layers"] for s in model["rpc_servers"]) + here
    _, metrics = split.request("GET", "/metrics")
    for s in rpc:
        assert f'lmsp_rpc_server_connected{{server="{s.address}"}} 1' in metrics


def test_a_model_registered_with_a_server_of_its_own_answers_as_the_local_one(pair, rpc):
    local, split = pair
    want = answer(local, REQUESTS["plain"])
    answer(split, REQUESTS["plain"])  # the module's model loaded, on both servers
    writer = split.pair("models:write,models:read")
    own = {"path": f"{MODEL}.gguf", "id": "own", "rpc_servers": [rpc[1].address], "tensor_split": [1, 3]}
    shown = split.call("POST", "/v1/models", own, token=writer, expect=201)
    # the server is in use (the module's model holds layers there), none of this model's yet
    assert [(s["address"], s["state"], s["layers"]) for s in shown["rpc_servers"]] == [(rpc[1].address, "connected", 0)]
    got = split.call("POST", "/v1/responses", {"instructions": INSTRUCTIONS, **REQUESTS["plain"], "model": "own"},
                     token=token_of(split))
    assert got["output"][0]["content"][0]["text"] == want["output"][0]["content"][0]["text"]
    model = split.call("GET", "/v1/models/own", token=writer)
    assert [run["place"] for run in model["layers"]] == ["cpu", rpc[1].address, "cpu"]
    assert model["layers"][1]["count"] > model["layers"][0]["count"]  # 3 shares of 4 on the server
    bad = split.request("POST", "/v1/models", {**own, "id": "bad", "rpc_servers": ["nowhere"]}, token=writer)
    assert bad[0] == 400 and bad[1]["error"]["param"] == "rpc_servers"


def test_a_server_that_does_not_answer_leaves_the_model_unavailable_naming_it(tmp_path, smollm2_path):
    silent = f"127.0.0.1:{free_port()}"
    served = real_server(tmp_path, LMSP_RPC_SERVERS=silent).start(timeout=180)
    try:
        token = served.pair()
        status, failed = served.request("POST", "/v1/responses",
                                        {"model": MODEL, "input": "Hi", "max_output_tokens": 4}, token=token)
        assert silent in str(failed), (status, failed)
        model = served.call("GET", f"/v1/models/{MODEL}", token=token)
        assert model["state"] == "unavailable"
        assert model["rpc_servers"][0]["state"] == "unreachable" and silent in model["rpc_servers"][0]["error"]
    finally:
        served.stop(timeout=10)


@pytest.mark.slow  # a real service, crash and restart: seconds each on 2 cores
def test_a_resume_task_killed_continues_to_the_uninterrupted_text(tmp_path, pair):
    local, _ = pair
    story = uninterrupted_text(local, token_of(local), {**STORY, "max_output_tokens": 120})
    # servers of its own: each serves one client at a time, and the module's split service holds those
    rpc = [RpcServer(tmp_path).start() for _ in range(2)]
    crashed = real_server(tmp_path, LMSP_RPC_SERVERS=",".join(s.address for s in rpc))
    try:
        crashed.start(timeout=180)
        token = crashed.pair()
        [task_id] = start_running(crashed, token, {**STORY, "max_output_tokens": 120}, ["resume"]).values()
        before = deltas(crashed.events(token, task_id))
        crashed.kill()  # the master and its worker, SIGKILL: the servers see the connection close
        crashed.start(timeout=180)
        assert resumed_text(crashed, token, task_id, before) == story
    finally:
        crashed.stop(timeout=10)
        for s in rpc:
            s.stop()


@pytest.mark.slow  # a real service and a server killed and restarted: seconds each on 2 cores
def test_a_server_killed_mid_generation_fails_resumes_or_retries_its_tasks_and_the_model_comes_back(tmp_path, pair):
    local, _ = pair
    story = uninterrupted_text(local, token_of(local), STORY)
    rpc = [RpcServer(tmp_path).start() for _ in range(2)]  # its own: the module's service holds those
    # three slots: the streamed fail task, a resume and a retry one run together
    served = real_server(tmp_path, LMSP_RPC_SERVERS=",".join(s.address for s in rpc), LMSP_N_PARALLEL="3")
    try:
        served.start(timeout=180)
        token = served.pair()
        [worker] = served.workers()
        body = {**STORY, "max_output_tokens": 400, "stream": True, "background": True, "on_restart": "fail"}
        stream = sse_events("127.0.0.1", served.port, "POST", "/v1/responses", token=token, body=body, timeout=180)
        seen = [next(stream)]
        while seen[-1]["type"] != "response.output_text.delta":
            seen.append(next(stream))
        resumed, retried = start_running(served, token, STORY, ["resume", "retry"]).values()
        before = deltas(served.events(token, resumed))
        rpc[1].kill()
        # the relay answers for the lost server: the worker lives on, the streamed task fails
        seen += list(stream)
        assert seen[-1]["type"] == "response.failed"
        error = seen[-1]["response"]["error"]
        assert error["code"] == "backend_lost" and rpc[1].address in error["message"]
        model = served.call("GET", f"/v1/models/{MODEL}", token=token)
        assert model["state"] == "unavailable"
        assert (model["rpc_servers"][1]["state"], model["rpc_servers"][1]["address"]) == ("unreachable", rpc[1].address)
        assert rpc[1].address in model["rpc_servers"][1]["error"]
        for task_id in (resumed, retried):  # given back, its attempt counted: it waits for the model
            waiting = served.wait_task(token, task_id, lambda t: t["attempts"] == 2)
            assert waiting["status"] not in FINISHED
        rpc[1] = RpcServer(tmp_path, port=rpc[1].port).start()  # the server is back: the model loads again
        assert resumed_text(served, token, resumed, before) == story
        retry = served.wait_task(token, retried, lambda t: t["status"] in FINISHED, timeout=180)
        assert (retry["status"], retry["attempts"]) == ("completed", 2)
        response = served.call("GET", f"/v1/responses/{retry['response_id']}", token=token)
        assert response["output"][0]["content"][0]["text"] == story  # run again from the start
        again = served.call("POST", "/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 4},
                            token=token)
        assert again["status"] in ("completed", "incomplete")
        assert served.call("GET", f"/v1/models/{MODEL}", token=token)["state"] == "loaded"
        assert served.workers() == [worker]
    finally:
        served.stop(timeout=10)
        for s in rpc:
            if s.proc is not None:
                s.stop()
