"""A scripted runtime for the few API tests that need a task held in a given
state (running while a cancel arrives, idle streams for heartbeats). It drives
the REAL store through the worker side of its API, like the real runtime.

It implements the runtime's protocol as the API sees it
(:class:`lmsp.contracts.RuntimeAPI`); mypy checks that it does
(tests/api/test_fakes.py).
"""
from __future__ import annotations

import time
from typing import Any

from lmsp.contracts import ClaimRecord, CreatedTask, NewTask, RuntimeAPI, StepItem, StepOutcome
from lmsp.errors import ContextLengthExceeded, InvalidRequest, NotFound
from lmsp.objects import wants_logprobs
from lmsp.runtime.registry import model_object
from lmsp.store import Store

OWNER = "scripted-worker"


class ScriptedRuntime:
    ready = True
    draining = False
    streams_ending = False
    watches_store = False  # its waits poll the store

    def __init__(self, store: Store, *, auto: bool = True, text: str = "Hello from the scripted worker") -> None:
        self.store = store
        self.auto = auto
        self.text = text
        self.cancels: list[str] = []
        self.checked: list[dict[str, str]] = []
        self.embedded: list[dict[str, Any]] = []  # the task of each embeddings request, while it ran

    # what the web layer calls
    def create_task(self, new: NewTask) -> CreatedTask:
        self.check_request(new.model, new.messages, new.request)
        created = self.store.create_task(**new.creation())
        if created["replay"] is None:
            self.run_queued()
        return created

    def run_queued(self) -> None:
        """The scripted worker's round over the tasks just queued (a test may replace it)."""
        if self.auto:
            for claim in self.start_all():
                self.finish(claim["task_id"], self.text)

    def notify_cancel(self, task_id: str) -> None:
        self.cancels.append(task_id)

    def commit_generation(self) -> int:
        return 0  # nothing is announced: every wait asks the store

    def committed_events(self, task_id: str, after: int) -> list[dict[str, Any]] | None:
        return None  # nothing kept in memory: the store has every event

    def wait_for_commit(self, task_id: str, after_seq: int, timeout: float, since: int | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.store.last_sequence(task_id) > after_seq:
                    return
            except NotFound:
                return
            time.sleep(min(0.005, timeout))

    def check_request(self, model_id: str, messages: list[dict[str, str]],
                      request: dict[str, Any] | None = None) -> list[int] | None:
        self.checked = [dict(m) for m in messages]  # the prompt as the engine would get it
        n = sum(len(m["content"].split()) for m in messages)
        prompt = (request or {}).get("prompt")
        if prompt is not None:  # a completion's raw prompt: words, or token ids of a 1000-token vocabulary
            n = len(prompt.split()) if isinstance(prompt, str) else len(prompt)
            if not isinstance(prompt, str) and any(t >= 1000 for t in prompt):
                raise InvalidRequest("a token id is outside the vocabulary of 1000 tokens", param="prompt")
        if n > 1000:
            raise ContextLengthExceeded(f"the prompt is {n} tokens; at most 1000 fit", param="input")
        return None

    def model_object(self, model_id: str) -> dict[str, Any]:
        return model_object(self.store.get_model(model_id))

    def detokenize(self, model_id: str, tokens: list[int]) -> str:
        """Token id N is the text "<N>"."""
        self.model_object(model_id)
        return "".join(f"<{t}>" for t in tokens)

    def prompt_pieces(self, model_id: str, prompt: str | list[int]) -> list[bytes]:
        """A text's words (each with the space after it) or token id N's "<N>"."""
        self.model_object(model_id)
        if isinstance(prompt, str):
            words = prompt.split(" ")
            return [(w + " ").encode() for w in words[:-1]] + [words[-1].encode()]
        return [f"<{t}>".encode() for t in prompt]

    def embed(self, model_id: str, inputs: list[str | list[int]], *, client_id: str | None = None,
              max_unfinished: int | None = None) -> dict[str, Any]:
        """Vectors of 4 numbers from each input's length, normalized, made by a task of the
        store as the real runtime makes them (created running, ended, deleted)."""
        self.model_object(model_id)
        vectors, n = [], 0
        for value in inputs:
            size = len(value.split()) if isinstance(value, str) else len(value)
            if size > 1000:
                raise ContextLengthExceeded(f"an input is {size} tokens; at most 1000 fit", param="input")
            n += size
            raw = [1.0, float(size), 0.5, -1.0]
            norm = sum(x * x for x in raw) ** 0.5
            vectors.append([x / norm for x in raw])
        created = self.store.create_task(client_id=client_id, model=model_id, request={"inputs": len(inputs)},
                                         on_restart="fail", background=False, stream=False, kind="embedding",
                                         claim=(OWNER, 5.0), max_unfinished=max_unfinished)
        assert created["task"] is not None and created["response"] is not None
        task_id = created["task"]["id"]
        self.embedded.append(self.store.get_task(task_id))  # what a reader of /v1/tasks saw meanwhile
        self.store.append_step(OWNER, [{"task_id": task_id, "finish": "stop",
                                        "usage": {"input_tokens": n, "output_tokens": 0}}])
        self.store.delete_response(created["response"]["id"])
        return {"vectors": vectors, "prompt_tokens": n, "task_id": task_id}

    def list_models(self) -> list[dict[str, Any]]:
        return [self.model_object(m["id"]) for m in self.store.list_models()]

    def register_model(self, path: str, model_id: str | None = None, *, rpc_servers=None,
                       tensor_split=None) -> dict[str, Any]:
        raise InvalidRequest("the scripted worker registers no model files", param="path")

    def load_model(self, model_id: str) -> dict[str, Any]:
        self.store.set_model_state(model_id, "loaded")
        return self.model_object(model_id)

    def unload_model(self, model_id: str) -> dict[str, Any]:
        self.store.set_model_state(model_id, "available")
        return self.model_object(model_id)

    def delete_model(self, model_id: str) -> None:
        self.store.delete_model(model_id)

    def metrics(self) -> dict[str, Any]:
        return {"tokens_generated": 3, "ttft_seconds": {"buckets": [[0.1, 1], [1.0, 2]], "sum": 0.6,
                                                        "count": 2}}

    # what a test drives
    def start_all(self) -> list[ClaimRecord]:
        claims = self.store.claim(OWNER, limit=100, lease=60)
        for claim in claims:
            self.store.set_running(claim["task_id"], OWNER)
        return claims

    def step(self, task_id: str, delta: str, finish: str | None = None, top: int | None = None) -> StepOutcome:
        """One token of text; ``top``: the task asked for log probabilities with that many
        alternatives (the token itself at -0.5, then "alt1" at -1.0, "alt2" at -2.0...)."""
        usage = {"input_tokens": 3, "output_tokens": len(delta.split())} if finish else None
        item: StepItem = {"task_id": task_id, "delta": delta, "tokens": [1], "finish": finish, "error": None,
                                "usage": usage, "kv_path": None}
        if top is not None:
            alternatives = [(delta, -0.5)] + [(f"alt{i}", -float(i)) for i in range(1, top)]
            item["logprobs"] = [{"token": delta, "logprob": -0.5, "bytes": list(delta.encode()), "top_logprobs": [
                {"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in alternatives[:top]]}]
        return self.store.append_step(OWNER, [item])

    def finish(self, task_id: str, text: str, finish: str = "stop") -> StepOutcome:
        request = self.store.get_request(self.store.get_task(task_id)["response_id"])
        top = int(request.get("top_logprobs") or 0) if wants_logprobs(request) else None
        words = text.split(" ")
        for word in words[:-1]:
            self.step(task_id, word + " ", top=top)
        return self.step(task_id, words[-1], finish, top=top)


def _implements_the_protocol(store: Store) -> RuntimeAPI:
    """Never called: mypy checks that the scripted runtime is a RuntimeAPI (tests/api/test_fakes.py)."""
    return ScriptedRuntime(store)
