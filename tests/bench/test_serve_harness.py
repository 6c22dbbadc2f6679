"""The serving benchmark's load generator and statistics, against a fake server.

The fake speaks the two stream formats the benchmark reads (LMSP/OpenAI
Responses events and llama-server's ``/completion`` chunks), so these tests
check the measuring itself without starting either real server.
"""
from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from results_path import write_result  # noqa: E402
from serving import cli, load, procs, protocols, report, servers, stats  # noqa: E402


class FakeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list = []

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _send_sse(self, frames: list[str], cut: bool = False) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for frame in frames[:-1] if cut else frames:
            self.wfile.write(frame.encode())
            self.wfile.flush()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeHandler.seen.append((self.path, body, self.headers.get("Authorization")))
        if body.get("seed") == 666:
            payload = b'{"error": {"code": "invalid_request", "message": "no"}}'
            self.send_response(400)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        n = body.get("max_output_tokens") or body.get("n_predict")
        if self.path == "/v1/responses":
            frames = [f"id: 1\nevent: response.created\ndata: {json.dumps({'type': 'response.created'})}\n\n",
                      ": keep-alive\n\n"]
            for i in range(n):
                ev = {"type": "response.output_text.delta", "delta": f"t{i}"}
                frames.append(f"id: {i + 2}\nevent: response.output_text.delta\ndata: {json.dumps(ev)}\n\n")
            done = {"type": "response.incomplete",
                    "response": {"usage": {"input_tokens": 11, "output_tokens": n}}}
            frames.append(f"id: {n + 2}\nevent: response.incomplete\ndata: {json.dumps(done)}\n\n")
            self._send_sse(frames, cut=body.get("seed") == 777)
        elif self.path == "/completion":
            frames = []
            # the first chunk holds back an incomplete character: no text, then two tokens at once
            chunks = [("", 1), ("ab", 2)] + [(f"c{i}", i + 3) for i in range(n - 2)]
            for text, done in chunks:
                msg = {"content": text, "tokens": [1], "stop": False, "tokens_predicted": done}
                frames.append(f"data: {json.dumps(msg)}\n\n")
            final = {"content": "", "stop": True, "tokens_predicted": n, "tokens_evaluated": 9}
            frames.append(f"data: {json.dumps(final)}\n\n")
            self._send_sse(frames)
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()


@pytest.fixture
def fake_port():
    FakeHandler.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeHandler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def test_responses_stream_counts_tokens_and_latencies(fake_port):
    cfg = load.LoadConfig(max_tokens=5, seed=100)
    proto = protocols.ResponsesProtocol("tiny")
    results = load.run_level(fake_port, proto, {"Authorization": "Bearer x"}, clients=2,
                              n_requests=3, cfg=cfg, first_index=0)
    assert [r.error for r in results] == [None, None, None]
    assert all(r.output_tokens == 5 and r.input_tokens == 11 and r.text_events == 5 for r in results)
    assert all(r.ttft is not None and r.ttft >= 0 and len(r.gaps) == 4 for r in results)
    assert all(len(r.event_gaps) == 4 for r in results)
    seeds = sorted(body["seed"] for _, body, _ in FakeHandler.seen)
    assert seeds == [100, 101, 102]
    assert all(auth == "Bearer x" and body["stream"] is True and body["model"] == "tiny"
               for _, body, auth in FakeHandler.seen)
    level = stats.summarize("tiny", "lmsp", 2, results, max_tokens=5, peak_rss=50 * 1048576)
    assert (level.requests, level.failed, level.output_tokens, level.short_outputs) == (3, 0, 15, 0)
    assert level.tok_s > 0 and level.peak_rss_mb == 50.0 and level.mean_input_tokens == 11.0
    assert level.tokens_per_event == 1.0


def test_completion_stream_spreads_gaps_over_the_tokens_a_chunk_carries(fake_port):
    proto = protocols.CompletionProtocol(fake_port)
    proto._templated = {proto.key(load.make_prompt(0, 24)): "templated"}
    res = load.one_request(fake_port, proto, {}, 0, load.LoadConfig(max_tokens=6))
    assert res.ok and res.output_tokens == 6 and res.input_tokens == 9
    # text chunks: "ab" (2 tokens), then c0..c3 (1 each): the later 4 chunks give 4 gaps
    assert res.text_events == 5 and len(res.gaps) == 4
    assert len(res.event_gaps) == 4  # the gaps as they are, one per later chunk
    path, body, _ = FakeHandler.seen[0]
    assert path == "/completion" and body["prompt"] == "templated"
    assert "ignore_eos" not in body and body["min_p"] == 0.0  # it stops at the end of text, as lmsp does


def test_failures_are_counted_not_raised(fake_port):
    proto = protocols.ResponsesProtocol("tiny")
    rejected = load.one_request(fake_port, proto, {}, 566, load.LoadConfig(max_tokens=3, seed=100))
    assert not rejected.ok and rejected.error.startswith("HTTP 400")
    cut = load.one_request(fake_port, proto, {}, 677, load.LoadConfig(max_tokens=3, seed=100))
    assert not cut.ok and "terminal" in cut.error
    level = stats.summarize("tiny", "lmsp", 1, [rejected, cut], max_tokens=3, peak_rss=None)
    assert level.failed == 2 and level.tok_s == 0.0 and level.peak_rss_mb is None


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert stats.percentile(values, 50) == 50.0
    assert stats.percentile(values, 99) == 99.0
    assert stats.percentile([3.0], 99) == 3.0
    assert stats.percentile([], 50) is None


def test_ratios_and_goals_compare_each_variant_to_llama():
    def level(server, clients, tok_s, ttft, rss, failed=0):
        return stats.LevelResult("tiny", server, clients, 4, failed, 100, 1.0, tok_s, ttft, ttft, 1.0, 2.0,
                                 rss, 0, 10.0, 1.0, 0.5, [])
    levels = [level("llama", 1, 100.0, 10.0, 100.0), level("lmsp", 1, 96.0, 12.0, 150.0),
              level("llama", 16, 400.0, 20.0, 100.0), level("lmsp", 16, 380.0, 21.0, 170.0, failed=1),
              level("lmsp-noevents", 16, 395.0, 20.0, 150.0), level("lmsp-memevents", 16, 420.0, 20.0, 150.0)]
    levels[0].cpu_ms_per_token, levels[1].cpu_ms_per_token = 0.5, 0.6
    # lmsp's master and worker share pages: the RSS sum counts them twice, PSS once
    for lvl, pss in zip(levels[:4], (100.0, 130.0, 100.0, 145.0)):
        lvl.peak_pss_mb = pss
    rows = {(x["server"], x["clients"]): x for x in stats.ratio_rows(levels)}
    assert rows[("lmsp", 1)]["tok_s"] == pytest.approx(0.96)
    assert rows[("lmsp", 1)]["cpu_per_token"] == pytest.approx(1.2)
    assert rows[("lmsp", 16)]["cpu_per_token"] is None  # not measured: no ratio
    assert "| 1.20 |" in report.ratio_table([rows[("lmsp", 1)]])
    assert "| 0.600 |" in report.markdown_table([levels[1]])
    assert rows[("lmsp", 16)]["rss_delta_mb"] == pytest.approx(70.0)
    checks = "\n".join(report.goal_checks(levels))
    assert "MISS  tiny 1c tok/s ratio >= 1.0: 0.960" in checks
    assert "MISS  tiny 1c TTFT p50 ratio <= 1.05: 1.200" in checks
    assert "MISS  tiny 1c CPU per token ratio <= 1.0: 1.200" in checks
    assert "PASS  tiny 1c PSS - llama <= 40 MB: 30.000" in checks
    assert "RSS - llama" not in checks  # reported in the tables, judged on PSS
    assert "MISS  tiny 16c tok/s ratio >= 1.0" in checks
    assert "TTFT" not in "".join(line for line in checks.splitlines() if "16c" in line)  # 1 and 4 clients only
    assert "n/a   tiny 16c CPU per token ratio <= 1.0" in checks
    assert "MISS  tiny 16c failed == 0" in checks
    assert "PASS  tiny 1c failed == 0" in checks
    assert "MISS  tiny 16c PSS - llama <= 40 MB: 45.000" in checks
    assert "PASS  tiny 16c persistence cost <= 5% (no streaming, upper bound)" in checks
    assert "MISS  tiny 16c persistence cost <= 5% (streamed from memory): 0.095" in checks


def test_a_model_without_chat_template_gets_the_services_plain_format_on_llama_server(tmp_path,
                                                                                       monkeypatch):
    monkeypatch.setattr(servers, "has_chat_template", lambda path: False)
    args = servers.llama_template_args(tmp_path / "base.gguf", tmp_path)
    assert args[0] == "--chat-template-file"
    template = Path(args[1]).read_text()
    assert template == servers.PLAIN_CHAT_TEMPLATE
    # csrc/engine.cpp's fallback_template: "Role: content" and a blank line per message, then
    # "Assistant:"; the blank line is text of the loop's body, not trimmed by its closing tag
    assert ": {{ message['content'] }}\n\n{% endfor" in template
    for word in ("System", "User", "Assistant", "Assistant:{%- endif"):
        assert word in template


def test_llama_server_reuses_no_cached_prompt_unless_both_servers_do():
    for endpoint in ("responses", "chat", "completion"):
        proto = cli.llama_protocol(endpoint, 1, "m", load.LoadConfig())
        if endpoint == "completion":
            proto._templated[proto.key("p")] = "p"
        assert proto.body(0, "p", load.LoadConfig())["cache_prompt"] is False
    cached = load.LoadConfig(llama_prompt_cache=True)
    assert cli.llama_protocol("responses", 1, "m", cached).body(0, "p", cached)["cache_prompt"] is True


def test_a_model_with_a_chat_template_keeps_its_own(tmp_path):
    from lmsp.models.demo import write_demo_model

    path = tmp_path / "tiny.gguf"
    write_demo_model(path)
    assert servers.llama_template_args(path, tmp_path) == []


def test_a_model_record_names_its_commit_machine_and_command(tmp_path):
    def level(server, clients, tok_s):
        return stats.LevelResult("m", server, clients, 4, 0, 100, 1.0, tok_s, 10.0, 10.0, 1.0, 2.0,
                                 100.0, 0, 20.0, 1.0, 0.5, [])
    levels = [level("llama", 1, 100.0), level("lmsp", 1, 110.0)]
    args = cli.parse_args(["--models", "", "--rounds", "1"])
    s = servers.ServeSettings(threads=2, parallel=1, ctx_per_seq=256, n_gpu_layers=0)
    record = report.model_record(levels, args, {"lmsp m": "lmsp serve", "lmsp other": "x"}, s, load.LoadConfig())
    path = write_result("serve", "m", record, started=0.0, folder=tmp_path)
    saved = json.loads(path.read_text())
    assert path.name == "19700101T000000Z-serve-m.json" and saved["time"] == "1970-01-01T00:00:00Z"
    assert saved["model"] == "m" and saved["machine"]["nproc"] >= 1 and "commit" in saved
    assert saved["server_commands"] == {"lmsp m": "lmsp serve"}
    assert saved["prompt_tokens"] == {"llama": 20.0, "lmsp": 20.0}
    assert saved["ratios"][0]["tok_s"] == pytest.approx(1.1)
    assert "PASS  m 1c tok/s ratio >= 1.0: 1.100" in saved["goals"]


def test_process_tree_and_rss_watch_see_this_process():
    import os

    assert os.getpid() in procs.process_tree(os.getpid())
    watch = procs.RssWatch(os.getpid(), interval=0.01)
    watch.start()
    sum(i * i for i in range(3_000_000))  # some CPU time for the watch to count
    peak = watch.stop()
    assert peak > 1048576
    assert watch.cpu_s > 0


def test_median_round_is_picked_per_server_and_level():
    def level(server, tok_s, rnd):
        lvl = stats.LevelResult("tiny", server, 4, 4, 0, 100, 1.0, tok_s, 1.0, 1.0, 1.0, 2.0,
                                10.0, 0, 10.0, 1.0, 0.5, [])
        lvl.round = rnd
        return lvl
    levels = [level("llama", 300.0, 0), level("llama", 100.0, 1), level("llama", 200.0, 2),
              level("lmsp", 50.0, 0), level("lmsp", 70.0, 1)]
    picked = {x.server: (x.tok_s, x.round) for x in stats.median_rounds(levels)}
    assert picked == {"llama": (200.0, 2), "lmsp": (50.0, 0)}
    # a round with failures (and so fewer tokens/s) is not the median, but its failures count
    failing = level("lmsp", 40.0, 2)
    failing.failed, failing.errors = 3, ["HTTP 503"]
    rows = {x.server: x for x in stats.median_rounds(levels + [failing])}
    assert (rows["lmsp"].tok_s, rows["lmsp"].round) == (50.0, 0)
    assert rows["lmsp"].failed == 3 and rows["lmsp"].requests == 12 and rows["lmsp"].errors == ["HTTP 503"]
    assert rows["llama"].failed == 0 and rows["llama"].requests == 12


def test_round_stats_and_the_persistence_goal_on_means():
    def level(server, tok_s, rnd):
        return stats.LevelResult("tiny", server, 4, 8, 0, 100, 1.0, tok_s, 10.0, 12.0, 1.0, 2.0,
                                 100.0, 0, 10.0, 1.0, 0.5, [])
    levels = [level("lmsp", v, i) for i, v in enumerate((1900.0, 2000.0, 2100.0))]
    levels += [level("lmsp-memevents", v, i) for i, v in enumerate((2000.0, 2100.0, 2200.0))]
    by_server = {x["server"]: x for x in stats.round_stats(levels)}
    assert by_server["lmsp"]["tok_s_mean"] == pytest.approx(2000.0)
    assert by_server["lmsp"]["tok_s_std"] == pytest.approx(100.0)
    assert (by_server["lmsp"]["tok_s_min"], by_server["lmsp"]["tok_s_max"], by_server["lmsp"]["rounds"]) == (
        1900.0, 2100.0, 3)
    checks = report.persistence_on_means(list(by_server.values()))
    assert checks == ["  PASS  tiny 4c persistence cost <= 5% against lmsp-memevents, means of 3 rounds: 0.048"]
    table = report.round_stats_table(list(by_server.values()))
    assert "| tiny | lmsp | 4 | 3 | 2000.0 | 100.0 | 1900.0 | 2100.0 |" in table


def test_paired_ratios_take_each_round_against_llama_servers_round_of_the_same_number():
    def level(server, tok_s, rnd, ttft=10.0, cpu=1.0):
        lvl = stats.LevelResult("m", server, 4, 8, 0, 100, 1.0, tok_s, ttft, ttft, 1.0, 2.0,
                                100.0, 0, 10.0, 1.0, 0.5, [])
        lvl.round, lvl.cpu_ms_per_token = rnd, cpu
        return lvl
    # the machine slows down in round 1 for both: the ratio of the median rounds (100/50) says 2.0,
    # each round's own ratio says 1.1 or 1.2
    rounds = [level("llama", 100.0, 0), level("lmsp", 110.0, 0, ttft=9.0, cpu=0.9),
              level("llama", 50.0, 1), level("lmsp", 60.0, 1, ttft=12.0, cpu=1.0),
              level("llama", 90.0, 2), level("lmsp", 99.0, 2, ttft=10.0)]
    paired = stats.paired_ratios(rounds)[("m", "lmsp", 4)]
    assert paired["rounds"] == 3
    assert paired["tok_s"] == pytest.approx(1.1)
    assert paired["ttft_p50"] == pytest.approx(1.0) and paired["cpu_per_token"] == pytest.approx(1.0)
    checks = "\n".join(report.goal_checks(stats.median_rounds(rounds), rounds))
    assert "PASS  m 4c tok/s ratio >= 1.0: 1.100" in checks
    assert "PASS  m 4c TTFT p50 ratio <= 1.05: 1.000" in checks
    assert "| m | lmsp | 4 | 3 | 1.10 | 1.00 | 1.00 |" in report.paired_table(stats.paired_ratios(rounds))


def test_a_conversation_repeats_its_turns_with_the_answers(fake_port):
    cfg = load.LoadConfig(max_tokens=2, seed=100, turns=3)
    results = load.run_level(fake_port, protocols.ResponsesProtocol("tiny"), {}, 1, 3, cfg, first_index=0)
    assert [r.ok for r in results] == [True] * 3 and [r.text for r in results] == ["t0t1"] * 3
    inputs = [body["input"] for _, body, _ in FakeHandler.seen]
    assert inputs[0] == load.make_prompt(0, 24)
    assert inputs[2] == [{"role": "user", "content": load.make_prompt(0, 24)},
                         {"role": "assistant", "content": "t0t1"},
                         {"role": "user", "content": load.make_prompt(1, 24)},
                         {"role": "assistant", "content": "t0t1"},
                         {"role": "user", "content": load.make_prompt(2, 24)}]
    assert [body["seed"] for _, body, _ in FakeHandler.seen] == [100, 101, 102]


def test_the_chat_protocol_asks_the_service_what_it_takes_and_reads_its_chunks():
    from lmsp.api.chat import parse_chat
    from lmsp.api.openai_shapes import ChunkFraming

    cfg = load.LoadConfig(max_tokens=5, seed=100)
    body = protocols.ChatProtocol("tiny", llama=False).body(3, "Hello", cfg)

    class Config:
        max_output_tokens, max_output_tokens_cap = 16, 64

    parsed = parse_chat(body, Config(), lambda: 1)  # no field it refuses
    assert parsed.stream and parsed.request["top_k"] == cfg.top_k and parsed.request["seed"] == 103
    llama = protocols.ChatProtocol().body(3, "Hello", cfg)
    assert "model" not in llama and "ignore_eos" not in llama and llama["cache_prompt"] is False
    framing = ChunkFraming("chat.completion", {"id": "chatcmpl-1", "created_at": 1, "model": "tiny"},
                           include_usage=True)
    usage = {"input_tokens": 7, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 2}
    frames = [framing.event({"type": "response.created"}),
              framing.event({"type": "response.output_text.delta", "delta": "Hi"}),
              framing.event({"type": "response.output_text.delta", "delta": "!"}),
              framing.event({"type": "response.completed", "response": {"usage": usage}})]
    proto, st, carried = protocols.ChatProtocol("tiny", llama=False), {}, []
    for block in b"".join(frames).decode().split("\n\n"):
        if block.startswith("data: "):
            carried.append(proto.on_event(None, block[len("data: "):], st))
    assert st["text"] == "Hi!" and st["output_tokens"] == 2 and st["input_tokens"] == 7 and st["ok"]
    assert carried[-1] == (0, True)


def test_the_api_option_sets_llama_servers_endpoint_too():
    assert cli.parse_args(["--api", "chat"]).llama_endpoint == "chat"
    assert cli.parse_args([]).llama_endpoint == "responses"
    assert cli.parse_args(["--api", "chat", "--llama-endpoint", "completion"]).llama_endpoint == "completion"


def test_a_window_variant_sets_the_commit_window():
    assert servers.variant_env("lmsp-window12") == {"LMSP_COMMIT_WINDOW_MS": "12"}
    assert servers.variant_env("lmsp-window2.5") == {"LMSP_COMMIT_WINDOW_MS": "2.5"}
    assert servers.variant_env("lmsp-nofsync") == {"LMSP_DURABILITY": "off"}
    assert servers.is_variant("llama") and servers.is_variant("lmsp-window4")
    for name in ("lmsp-windowN", "lmsp-window", "lmsp-windowfast", "x"):
        assert not servers.is_variant(name)


def test_a_commit_variant_is_gunicorn_with_the_services_configuration_and_the_variants_app(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    argv, env = servers.lmsp_argv(["lmsp"], "lmsp", tmp_path / "data", 8123, model)
    assert argv == ["lmsp", "serve", "--data-dir", str(tmp_path / "data"), "--bind", "127.0.0.1:8123",
                    "--model", str(model)] and env == {}
    argv, env = servers.lmsp_argv(["lmsp"], "lmsp-memevents", tmp_path / "data", 8123, model)
    conf = "python:lmsp.serving.gunicorn_conf"
    assert argv[1:] == ["-m", "gunicorn", "--config", conf, "variants:get_app('memevents')"]
    assert env["LMSP_DATA_DIR"] == str(tmp_path / "data") and env["LMSP_BIND"] == "127.0.0.1:8123"
    assert env["LMSP_MODEL"] == str(model.resolve())
    assert env["PYTHONPATH"].split(":")[0] == str(servers.ROOT / "bench")
    assert servers.is_variant("lmsp-noevents") and servers.variant_env("lmsp-memevents") == {}
