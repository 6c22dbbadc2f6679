"""Constrained generation's speed: tokens/s of structured output (a JSON schema of
realistic size) and of a forced tool call, against unconstrained generation on the
same model, and against llama-server's chat endpoint with the same
``response_format`` and tools, in one run.

Both servers run the model with the same threads, context and batch (bench/serve.py).
Requests are greedy and one at a time; the contenders take turns request by
request, so that a busy machine's drift falls on both alike. Each form's requests
run together after a first one whose prompt both servers then keep cached, so
that a figure is of generation, not of a prefill (the tool form's prompt is
longer: it describes the tool). A figure is output tokens over the request's
wall time, the median of its requests.

The forced call compares the same work on both servers. llama-server makes no
call for a model whose template knows no tools (it answers in free text), so
its request is the one lmsp's fallback makes of the call: the same messages,
with the tool described in the system message by lmsp's own text, and a
``response_format`` holding the output to the call's JSON schema (the grammar
lmsp uses with ``parallel_tool_calls`` false). Both prompts are then the same
tokens and both outputs the same form. Its unconstrained reference is the same
prompt with no tools and no constraint, up to about the call's length
(``toolfree``): the forced call over free text of a 59-token prompt would count
the longer prompt's prefill and attention as the grammar's cost.

    python bench/constrained.py --model ~/.cache/lmsp/models/smollm2-135m-instruct.gguf \\
        --llama-server /work/ref/bin/llama-server --rounds 5

Goals: lmsp constrained >= 0.95x llama-server's, and >= 0.8x lmsp unconstrained.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_path import write_result  # noqa: E402
from serving.servers import LlamaServer, LmspServer, ServeSettings, lmsp_command  # noqa: E402
from serving.sse import http_json  # noqa: E402

from lmsp.runtime.constraints import call_schema  # noqa: E402
from lmsp.runtime.prompt import with_tools  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
INSTRUCTIONS = "You are a helpful assistant."
PROMPT = ("Make up a customer record for a small online shop: a name, an email address, an age, a postal "
          "address, a membership level, a few interests and the last three order totals.")
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "email": {"type": "string", "maxLength": 60},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string", "maxLength": 60},
                "city": {"type": "string", "maxLength": 40},
                "postcode": {"type": "string", "maxLength": 12},
                "country": {"type": "string", "maxLength": 40},
            },
            "required": ["street", "city", "postcode", "country"],
            "additionalProperties": False,
        },
        "membership": {"enum": ["none", "silver", "gold", "platinum"]},
        "interests": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 5},
        "last_orders": {"type": "array", "items": {"type": "number"}, "maxItems": 3},
        "newsletter": {"type": "boolean"},
    },
    "required": ["name", "email", "age", "address", "membership", "interests", "last_orders", "newsletter"],
    "additionalProperties": False,
}
TOOL = {
    "name": "create_customer",
    "description": "Creates a customer record in the shop's database.",
    "parameters": SCHEMA,
}
MODES = ("free", "schema", "tool", "toolfree")
# "toolfree": the forced call's prompt (the tool described in the system message) with
# no constraint and no tools, up to about the call's length: the unconstrained
# reference of the same work for the call
TOOLFREE_TOKENS = 160


def lmsp_body(mode: str, max_tokens: int) -> dict:
    body = {"instructions": INSTRUCTIONS, "input": PROMPT, "temperature": 0, "seed": 1,
            "max_output_tokens": max_tokens}
    if mode == "schema":
        body["text"] = {"format": {"type": "json_schema", "name": "customer", "schema": SCHEMA, "strict": True}}
    elif mode == "tool":
        body.update(tools=[{"type": "function", **TOOL, "strict": True}], tool_choice="required",
                    parallel_tool_calls=False)
    elif mode == "toolfree":
        messages, _ = fallback_call_request(max_tokens)
        body.update(instructions=messages[0]["content"], max_output_tokens=min(max_tokens, TOOLFREE_TOKENS))
    return body


def fallback_call_request(max_tokens: int) -> tuple[list[dict], dict]:
    """The messages and the JSON schema of lmsp's fallback for the forced call: the
    reference's request for the same work (see the module docstring)."""
    request = {"tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False,
               "max_output_tokens": max_tokens}
    messages = with_tools([{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": PROMPT}],
                          request)
    return messages, call_schema([TOOL])


def llama_body(mode: str, max_tokens: int) -> dict:
    body = {"messages": [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": PROMPT}],
            "temperature": 0, "seed": 1, "max_tokens": max_tokens}
    if mode == "schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "customer", "schema": SCHEMA,
                                                                          "strict": True}}
    elif mode == "tool":
        body["messages"], schema = fallback_call_request(max_tokens)
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "call", "schema": schema,
                                                                          "strict": True}}
    elif mode == "toolfree":
        body["messages"], _ = fallback_call_request(max_tokens)
        body["max_tokens"] = min(max_tokens, TOOLFREE_TOKENS)
    return body


def one(server, mode: str, max_tokens: int, token: str | None) -> dict:
    """One request: its output tokens, wall time and whether its output holds to the form."""
    started = time.perf_counter()
    if token is None:
        status, body = http_json(server.port, "POST", "/v1/chat/completions", llama_body(mode, max_tokens),
                                 timeout=300)
        wall = time.perf_counter() - started
        assert status == 200 and body, (status, body)
        message = body["choices"][0]["message"]
        out = message.get("content") or ""
        calls = message.get("tool_calls") or ([out] if mode == "tool" and parses(out) else [])
        n = body["usage"]["completion_tokens"]
        cached = body.get("timings", {}).get("cache_n"), body["usage"]["prompt_tokens"]
    else:
        status, body = http_json(server.port, "POST", "/v1/responses",
                                 {"model": server.model_id, **lmsp_body(mode, max_tokens)},
                                 headers={"Authorization": f"Bearer {token}"}, timeout=300)
        wall = time.perf_counter() - started
        assert status == 200 and body, (status, body)
        items = body["output"]
        calls = [i for i in items if i["type"] == "function_call"]
        out = "".join(p["text"] for i in items if i["type"] == "message" for p in i["content"])
        n = body["usage"]["output_tokens"]
        cached = body["usage"]["input_tokens_details"]["cached_tokens"], body["usage"]["input_tokens"]
    holds = bool(calls) if mode == "tool" else (mode in ("free", "toolfree") or parses(out))
    return {"tokens": n, "seconds": wall, "tokens_per_s": n / wall if wall > 0 else 0.0, "holds": holds,
            "prompt_cached": cached[0], "prompt": cached[1]}


def parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def start(args, s: ServeSettings, work: Path) -> tuple[LlamaServer, LmspServer, str]:
    model = Path(args.model).expanduser()
    llama = LlamaServer.create(Path(args.llama_server), model, s, work, ["--jinja"])
    lmsp = LmspServer.create(lmsp_command(args.lmsp), model, s, work, "lmsp", {})
    for srv in (llama, lmsp):
        srv.start()
    llama.ready(s)
    lmsp.ready(s)
    lmsp.model_id = model.stem
    return llama, lmsp, lmsp.pair()


def run(args) -> dict:
    s = ServeSettings(threads=args.threads, parallel=1, ctx_per_seq=4096, n_gpu_layers=0)
    work = Path(args.work)
    llama, lmsp, token = start(args, s, work)
    samples: dict[str, list[dict]] = {f"{who}-{mode}": [] for who in ("lmsp", "llama") for mode in MODES}
    try:
        for mode in MODES:
            # a first request of each: its grammar converted, its prompt cached (both servers
            # keep a slot's prompt), so that the figures are of generation, not of a prefill
            one(lmsp, mode, args.max_tokens, token)
            one(llama, mode, args.max_tokens, None)
            for _ in range(args.rounds):
                samples[f"lmsp-{mode}"].append(one(lmsp, mode, args.max_tokens, token))
                samples[f"llama-{mode}"].append(one(llama, mode, args.max_tokens, None))
    finally:
        lmsp.stop()
        llama.stop()
    rate = {k: statistics.median(x["tokens_per_s"] for x in v) for k, v in samples.items()}
    ratios = {
        "schema_over_llama_schema": rate["lmsp-schema"] / rate["llama-schema"],
        "tool_over_llama_tool": rate["lmsp-tool"] / rate["llama-tool"],
        "schema_over_free": rate["lmsp-schema"] / rate["lmsp-free"],
        "tool_over_free": rate["lmsp-tool"] / rate["lmsp-toolfree"],
        "free_over_llama_free": rate["lmsp-free"] / rate["llama-free"],
    }
    holds = {k: sum(x["holds"] for x in v) / len(v) for k, v in samples.items()}
    return {"tokens_per_s": rate, "ratios": ratios, "holds": holds, "samples": samples}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--llama-server", required=True)
    p.add_argument("--lmsp", default=None, help="the lmsp command (default: the virtualenv's)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=400)
    p.add_argument("--work", default=str(ROOT / "bench" / "out" / "constrained"))
    p.add_argument("--out", default=None, help="result JSON (default: bench/results/TIME-constrained-MODEL.json)")
    args = p.parse_args(argv)
    started = time.time()
    result = run(args)
    record = {"model": Path(args.model).name, "command": shlex.join([sys.executable, *sys.argv]),
              "threads": args.threads, "rounds": args.rounds, "max_tokens": args.max_tokens,
              "goals": {"schema_over_llama_schema": 0.95, "tool_over_llama_tool": 0.95, "schema_over_free": 0.8,
                        "tool_over_free": 0.8}, **result}
    out = write_result("constrained", Path(args.model).stem, record, started=started,
                       out=Path(args.out) if args.out else None)
    for key, value in result["ratios"].items():
        print(f"{key:28s} {value:.3f}")
    for key, value in result["tokens_per_s"].items():
        print(f"{key:28s} {value:8.1f} tok/s, form held in {result['holds'][key]:.0%} of requests")
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
