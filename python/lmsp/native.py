"""The native engine: llama.cpp run in-process by a C++ thread.

This module is the public face of the compiled ``lmsp._native`` extension; code
outside the package imports from here. See ``lmsp/_native.pyi`` for the
signatures and ``Engine``'s docstring below for the behaviour.
"""

from __future__ import annotations

from . import cpu_check

# before the module loads: a build for another CPU is refused in one line, not by SIGILL
cpu_check.check()

from ._native import (  # noqa: E402
    BACKEND_LOST,
    BackendLostError,
    ChatParser,
    ChatTemplate,
    ContextLengthError,
    Engine,
    EngineClosedError,
    KvState,
    ModelFormatError,
    NativeError,
    QUANTIZE_TYPES,
    RPC_BUILT,
    RpcUnreachableError,
    TextStream,
    check_grammar,
    crc32_low_priority,
    low_priority_nice,
    quantize,
    read_gguf_info,
    rpc_hello,
    rpc_protocol,
    rpc_serve,
    schema_grammar,
    set_logging,
    system_info,
    write_low_priority,
)

__all__ = [
    "BACKEND_LOST",
    "BackendLostError",
    "ChatParser",
    "ChatTemplate",
    "ContextLengthError",
    "Engine",
    "EngineClosedError",
    "KvState",
    "ModelFormatError",
    "NativeError",
    "QUANTIZE_TYPES",
    "RPC_BUILT",
    "RpcUnreachableError",
    "TextStream",
    "check_grammar",
    "crc32_low_priority",
    "low_priority_nice",
    "quantize",
    "read_gguf_info",
    "rpc_hello",
    "rpc_protocol",
    "rpc_serve",
    "schema_grammar",
    "set_logging",
    "system_info",
    "write_low_priority",
]

Engine.__doc__ = """A loaded model and its decoding thread.

Engine(model_path, *, n_ctx=4096, n_parallel=4, n_threads=0, n_gpu_layers=0,
       n_batch=512, prefill_chunk=256, batch_invariant=True, prefix_cache=True,
       use_mmap=False, huge_pages=True, rpc_servers=[], tensor_split=[], rpc_timeout=60.0)

``n_ctx`` is the context of ONE sequence (capped at the model's training
context); ``n_parallel`` sequences decode together, one llama_batch per step;
``n_threads=0`` uses every core. Submissions beyond ``n_parallel`` wait inside
the engine. Prompts are prefilled ``prefill_chunk`` tokens per step so that a
long prompt does not stall running sequences. The weights are read into memory;
``use_mmap=True`` maps the file instead, which then must not change while the
engine lives (a read of a page past a truncated file's end kills the process).
Read into memory, the weights go into transparent huge pages where the
system has them (``huge_pages``; csrc/huge_pages.h): a decode step streams
them all, and a huge page takes one TLB entry for 2 MiB instead of 4 KiB.
A thread of the engine collapses them after the load, paced, while it
serves: ``info["weights_in_huge_pages"]`` counts the bytes collapsed so far,
``info["huge_pages_pending"]`` is true until it is done.

``rpc_servers`` (``HOST:PORT``, each an ``lmsp rpc-server``) split the
model's layers over this box's CPU and those servers: this box keeps the
first layers, the servers the rest and the output layer, in proportion to
each one's free memory, or to ``tensor_split`` (this box's share first, then
each server's). Each server is greeted first: one that does not answer, or
speaks another protocol version, raises ``RpcUnreachableError`` naming it.
``info["layers"]`` names each layer's place ("cpu" or the server), the
output layer last. ggml's client talks to each server through a relay of
this process: a server lost mid-generation ends the running sequences with
the error code ``backend_lost`` (``BACKEND_LOST``) naming it, and from then
on ``backend_lost`` holds that message and every call that would compute
raises ``BackendLostError``; close the engine and load the model again once
the server answers (docs/RPC.md). A server is lost, too, when its relay waits
for it (owes ggml's client an answer, or holds bytes for it) and it sends and
takes nothing for ``rpc_timeout`` seconds: a stopped or deadlocked process.
A relay is shared by every engine of the process on that server: it keeps the
timeout of the engine whose load made it.

With ``prefix_cache`` a slot keeps the KV of its last sequence (prompt and
generated tokens) while free, and a new sequence is given the free slot that
holds the longest start of its tokens and prefills only the rest: the next
turn of a conversation, a request made again, or prompts sharing a long
system message (a start shared only in a chat template's opening does not
count, so that it does not evict a conversation: see ``pick_slot``). Only KV left by
a sequence submitted with the same ``cache_key`` is reused (the service
passes the client, so that no client finds, or times, another's prompts).
Where the engine is batch invariant this gives the same output as a full
prefill. A slot also keeps the logits of its last prompt's last row: the
same prompt asked again (no ``resume``) prefills nothing, its first token
is sampled from them and ``n_cached`` is the whole prompt.

The KV of a prompt's start can leave the engine and come back (the
service's KV files, ``lmsp.kv``). A sequence submitted with
``persist=True`` keeps what its slot holds after its end (``stop`` or
``length``) for ``saved_prefix(seq)``: ``{"tokens", "tiled_rows",
"tiled_min", "state"}`` (llama.cpp's sequence state of exactly those
positions), copied between two engine steps, once; None when the slot went
to another sequence first, or the sequence outgrew a sliding window (its
state would not hold the first positions). Where prompts are prefilled tiled (batch
invariance on the CPU), only a prompt's rows are kept: its answer's were
decoded one row at a time, and a prefill of the next turn computes them
tiled. ``submit(..., prefix=that)`` with a prompt that starts with its
tokens loads it on admission in place of prefilling them, when it gives more
usable rows than a free slot's cache (``usable_prefix(n_prompt, n_held,
tiled_rows, tiled_min)``, ``cached_prefix(tokens, cache_key)``); the last
result's ``n_loaded`` counts them (they count in ``n_cached`` too), and
``prefix_refused`` is true when the state did not load (another model's or
engine's, damaged, another length): the prompt is then prefilled.
``info["kv_format"]`` names what such a state depends on besides the
weights.

Results come from ``poll()`` (non-blocking), in order per sequence, as dicts
``{"seq", "tokens", "text", "finish", "error", "n_prompt", "n_generated",
"n_cached", "n_loaded", "prefix_refused", "timings"}`` (``n_cached``, on the last result: the leading prompt
tokens taken from the cache); ``finish`` is None until the sequence's last result, then
"stop" (end-of-generation token, not included in ``tokens``, or a stop string,
not included in ``text``), "length" (max_tokens, or the context is full),
"cancelled" or "error". ``timings`` is {} except on the last result. The texts
of a sequence's results concatenate to its output text. A sequence submitted
with ``logprobs=True`` also has ``"logprobs"`` beside its results' tokens:
each token's natural log probability under the model (a softmax of its
logits, before temperature, top-k or top-p; with a grammar, over the tokens
the grammar allows at that position only); with ``top_logprobs=N`` too
(1 to 20), ``"top_logprobs"``: for each token the N most likely tokens of
its position, ``(token, logprob)`` pairs, most likely first (fewer where a
grammar allows fewer).
``token_bytes(token)`` is a token's text as generation emits it (bytes: a
token may hold part of a UTF-8 character). ``wait()`` blocks
without the GIL; ``fileno()`` is readable while results are pending.

A result is *urgent* when it carries its sequence's first text (a token
whose text is held back, part of a UTF-8 character or what may begin a stop
string, shows none yet) or is its last result. ``wait(timeout, urgent=True)`` returns once an urgent result is
pending, and ``urgent_fileno()`` is readable while one is: a consumer that
takes results in windows (the service commits them in groups) sleeps through
the others, and the engine thread neither writes a descriptor nor wakes a
thread for them. Results of one engine step are handed over together.

Sampling draws for output token i depend only on (seed, i); temperature 0 is
greedy. On the CPU backend a sequence's tokens do not depend on what else is in
the batch (see csrc/batch_plan.cpp), so ``snapshot()`` + ``submit(resume=...)`` in
a new engine continues the same output. ``batch_invariant=False`` trades that
for llama.cpp's faster CPU kernels everywhere (batched decoding on K-quant
weights gains most; prompts of 64 tokens or more already take the tiled
kernels); ``info["batch_invariant"]`` says which holds (False on a GPU), and
``info["reference_kernels"]`` whether invariance put the model's K-quant or
i-quant weights on ggml's one-row kernels. ``snapshot()`` of a sequence that
has finished raises KeyError.

``submit(..., grammar={...})`` constrains the output to a GBNF grammar
(llama.cpp's grammar sampler; its start rule is ``root``): ``{"gbnf": str,
"lazy": bool, "triggers": [{"type": "word" | "pattern" | "pattern_full" |
"token", "value": str, "token": int}], "preserved": [str], "prefill": str}``,
only ``gbnf`` required. The sampler's pick is kept when the grammar allows it;
otherwise a second draw (a counter of its own, independent of the first) is
made over the tokens the grammar allows: the token is drawn from the
sampler's distribution over the allowed tokens, renormalized, where
temperature alone shapes it. A constrained sequence is as deterministic, batch invariant and
resumable as any other (a resumed one's grammar takes its generated tokens
first). End-of-generation is allowed only where the grammar is complete. A
lazy grammar leaves the output free until a trigger appears (a word, a
regular expression matched from the start of the output, or a token), then
holds it. ``preserved``: special tokens whose text the output keeps;
``prefill``: text the prompt already opened the output with, taken by a
grammar that is not lazy first. A grammar that does not parse raises
ValueError. ``schema_grammar(schema_json)`` is llama.cpp's JSON-schema
converter: the grammar of the JSON texts a schema admits (ValueError for a
schema it cannot express). ``check_grammar(gbnf)`` raises the ValueError that
a submit with that grammar would, without an engine (neither holds the GIL).

``apply_chat_template(messages)`` renders the model's own chat template
(``tokenizer.chat_template``) with llama.cpp's Jinja engine, given what
llama-server gives it with ``--jinja`` on its defaults (``bos_token``,
``eos_token``, ``add_generation_prompt``; a BOS the template writes itself is
dropped where the tokenizer adds one). ``chat_prompt(messages)`` is that text
tokenized as llama-server tokenizes a prompt: special tokens added, special
token text parsed. A template that refuses the messages raises ValueError; one
that does not parse makes the model fail to load. ``info["has_chat_template"]``
says whether the model has a template; a model without one is formatted as
"System: ...\\n\\nUser: ...\\n\\n" and so on, ending with "Assistant:" when
``add_generation_prompt`` is true.

``chat_template()`` is the model's template (None without one) as llama.cpp's
chat layer uses it for tools: ``render(messages_json, tools=..., tool_choice=...,
parallel_tool_calls=..., json_schema=..., enable_thinking=...,
reasoning_effort=...)`` takes
OpenAI-style messages and function tools as JSON text and returns what
llama-server makes of them with ``--jinja``: ``prompt``, ``format`` (and
``format_name``), ``grammar`` (``submit``'s form, None without one, its
``prefill`` the generation prompt), ``additional_stops``,
``generation_prompt``, ``parser`` (serialized), ``supports_thinking``,
``thinking_start`` and ``thinking_end``; ``caps`` says what the template does
(``supports_tools``, ``supports_tool_calls``, ...). ``ChatParser(format,
generation_prompt, parser).parse(text, partial)`` reads an output as
``{"content", "reasoning", "tool_calls": [{"name", "arguments", "id"}]}``
(``partial``: the output so far; a whole output that does not match raises
ValueError).
"""
