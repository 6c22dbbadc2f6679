#!/usr/bin/env python3
"""Record llama-server's prompt tokens for a set of conversations, as golden data.

    python bench/prompt_golden.py --llama-server build/reference/bin/llama-server \\
        --model smollm2-135m-instruct=PATH.gguf --model gemma-3-270m=PATH.gguf

writes tests/runtime/data/prompt_golden.json (``--out`` to change), which
tests/runtime/test_real_models.py compares the service's prompts with, token
for token. llama-server is built from the pinned source by
``LMSP_REFERENCE_DIR=DIR LMSP_REFERENCE_TARGETS=llama-server bench/build_reference.sh``.
The demo model (``lmsp.models.demo``) is written by this script.

For each model, llama-server runs on loopback with ``--jinja`` and
``--no-prefill-assistant`` (a conversation that ends with an assistant
message gets a new assistant turn, as in the service, instead of continuing
that message). For each conversation (a /v1/responses body):

- a model with a chat template: the conversation as chat messages goes to
  ``POST /apply-template``, and the prompt text it answers to ``POST /tokenize``
  with ``add_special`` and ``parse_special`` (what llama-server does with the
  prompt of a chat request); ``/v1/chat/completions/input_tokens`` and
  ``/v1/responses/input_tokens`` (the body as the service receives it) must
  count the same number of tokens, or the script fails;
- a model without one: llama-server would render ChatML, which the service
  does not do; the service's plain format (docs/API.md) is tokenized by
  ``POST /tokenize`` as llama-server tokenizes a raw prompt.
"""
from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "runtime" / "data" / "prompt_golden.json"
DEMO = "lmsp-demo-tiny"

# (name, /v1/responses body without "model")
CONVERSATIONS: list[tuple[str, dict]] = [
    ("user", {"input": "What is the capital of France?"}),
    ("system_and_user", {"input": [{"role": "system", "content": "You are a pirate."},
                                   {"role": "user", "content": "Hello!"}]}),
    ("instructions", {"instructions": "Answer in one word.", "input": "Name a colour."}),
    ("empty_instructions", {"instructions": "", "input": "Hi"}),
    ("empty_system", {"input": [{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}]}),
    ("multi_turn", {"instructions": "Be brief.", "input": [
        {"role": "user", "content": "What is 2+2?"},
        {"type": "message", "role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"}]}),
    ("developer", {"input": [{"role": "developer", "content": "Reply in French."},
                             {"role": "user", "content": "Good morning"}]}),
    ("two_system_messages", {"instructions": "First rule.", "input": [
        {"role": "system", "content": "Second rule."}, {"role": "user", "content": "Go"}]}),
    ("content_part", {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "Summarise: tea is hot."}]}]}),
    ("unicode_and_markup", {"input": "Ünïcödé 日本語 🙂 and <|im_end|> <start_of_turn> <s> text"}),
    ("whitespace", {"input": "  leading and trailing  \n"}),
    ("ends_with_assistant", {"input": [{"role": "user", "content": "Tell me a joke."},
                                       {"type": "message", "role": "assistant", "content": "Why"}]}),
]


def chat_messages(body: dict) -> list[dict]:
    """The conversation as chat-completions messages (instructions first, as a system message)."""
    out = []
    if "instructions" in body:
        out.append({"role": "system", "content": body["instructions"]})
    given = body["input"]
    if isinstance(given, str):
        return out + [{"role": "user", "content": given}]
    for item in given:
        content = item["content"]
        if isinstance(content, list):
            content = "".join(part["text"] for part in content)
        out.append({"role": item["role"], "content": content})
    return out


def plain_prompt(messages: list[dict]) -> str:
    """The service's format for a model without a chat template (docs/API.md)."""
    roles = {"developer": "System", "system": "System", "user": "User", "assistant": "Assistant"}
    return "".join(f"{roles[m['role']]}: {m['content']}\n\n" for m in messages) + "Assistant:"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, path: str, body: dict) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise RuntimeError(f"llama-server {path} answered {resp.status}: {raw[:500]!r}")
    return json.loads(raw)


class LlamaServer:
    """llama-server on one model, on loopback, until close()."""

    def __init__(self, binary: Path, model: Path, log: Path) -> None:
        self.port = free_port()
        argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
                "--jinja", "--no-prefill-assistant", "-c", "2048", "--parallel", "1", "-t", "2",
                "--no-webui"]
        self.log = log.open("wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}); see {log}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"llama-server did not get ready; see {log}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def tokenize(srv: LlamaServer, text: str) -> list[int]:
    return post(srv.port, "/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"]


def templated_case(srv: LlamaServer, body: dict) -> dict:
    messages = chat_messages(body)
    prompt = post(srv.port, "/apply-template", {"messages": messages})["prompt"]
    tokens = tokenize(srv, prompt)
    counts = {
        "chat": post(srv.port, "/v1/chat/completions/input_tokens", {"messages": messages})["input_tokens"],
        "responses": post(srv.port, "/v1/responses/input_tokens", dict(body, model="m"))["input_tokens"],
    }
    for endpoint, n in counts.items():
        if n != len(tokens):
            raise RuntimeError(f"{endpoint} input_tokens {n} != {len(tokens)} tokens of /tokenize for {body}")
    return {"prompt": prompt, "tokens": tokens}


def record_model(binary: Path, name: str, path: Path, work: Path) -> dict:
    srv = LlamaServer(binary, path, work / f"{name}.log")
    try:
        has_template = _has_chat_template(path)
        cases = []
        for case, body in CONVERSATIONS:
            if has_template:
                out = templated_case(srv, body)
            else:
                prompt = plain_prompt(chat_messages(body))
                out = {"prompt": prompt, "tokens": tokenize(srv, prompt)}
            cases.append({"name": case, "request": body, **out})
            print(f"  {name} {case}: {len(out['tokens'])} tokens", file=sys.stderr)
    finally:
        srv.close()
    return {"model": name, "sha256": sha256_of(path), "has_chat_template": has_template, "cases": cases}


def _has_chat_template(path: Path) -> bool:
    from lmsp.native import read_gguf_info

    return bool(read_gguf_info(str(path)).get("chat_template"))


def dumps(data: dict) -> str:
    """JSON with one line per list of token ids."""
    text = json.dumps(data, ensure_ascii=False, indent=1)
    return re.sub(r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]",
                  lambda m: "[" + ", ".join(m.group(1).replace(",", " ").split()) + "]", text)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-server", type=Path, required=True, help="llama-server built from the pinned source")
    p.add_argument("--model", action="append", default=[], metavar="NAME=PATH",
                   help="a model to record (repeatable); the demo model is always recorded")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models: list[tuple[str, Path]] = []
    for spec in args.model:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            raise SystemExit(f"--model {spec!r}: expected NAME=PATH of a GGUF file")
        models.append((name, Path(path)))
    from lmsp.models.demo import write_demo_model

    with tempfile.TemporaryDirectory(prefix="prompt-golden-") as tmp:
        work = Path(tmp)
        models.insert(0, (DEMO, write_demo_model(work / f"{DEMO}.gguf")))
        records = [record_model(args.llama_server, name, path, work) for name, path in models]
    data = {
        "about": __doc__.strip().splitlines()[0],
        "command": "python bench/prompt_golden.py --llama-server PATH " + " ".join(
            f"--model {name}=PATH" for name, _ in models[1:]),
        "llama_server": "--jinja --no-prefill-assistant; /apply-template then /tokenize "
                        "(add_special, parse_special)",
        "models": records,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dumps(data) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
