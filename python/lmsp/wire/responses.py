"""A Responses request (LMSP B.5) checked: every field, its defaults, and the
task it makes."""

from __future__ import annotations

from typing import Any, Callable

from lmsp.contracts import NO_TURNS, CreateRequest, EarlierTurns
from lmsp.errors import InvalidRequest
from lmsp.ids import new_id
from lmsp.items.listed import input_items

from . import options, tools
from .fields import get_bool, get_int, get_number, get_str, reject_unknown
from .input import MAX_TEXT, SEED_MAX, check_nul, parse_messages, parse_stop
from .metadata import parse_metadata

FIELDS = (
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stream",
    "background",
    "store",
    "on_restart",
    "metadata",
    *options.FIELDS,
    *tools.FIELDS,
)
RESTART_POLICIES = ("fail", "retry", "resume")


def parse_create(
    body: dict[str, Any], config: Any, random_seed: Callable[[], int], earlier: EarlierTurns = NO_TURNS
) -> CreateRequest:
    """Check every field of B.5 and fill the defaults (``earlier``: the turns it continues)."""
    reject_unknown(body, FIELDS)
    model = get_str(body, "model", required=True, max_len=256)
    if "input" not in body or body["input"] is None:
        raise InvalidRequest("'input' is required", param="input")
    calls = earlier.calls if earlier.replay is not None else dict(earlier.calls)  # those of the input added
    messages = parse_messages(body["input"], calls)
    # what the task keeps of the input: the messages as checked, each content one text
    given = body["input"] if isinstance(body["input"], str) else [dict(m) for m in messages]
    messages = earlier.messages + messages
    instructions = get_str(body, "instructions", allow_empty=True, max_len=MAX_TEXT)
    if instructions is not None:  # an empty one is an empty system message
        check_nul(instructions, "instructions")
        messages.insert(0, {"role": "system", "content": instructions})
    max_output = get_int(body, "max_output_tokens", default=config.max_output_tokens, minimum=1)
    max_output = min(max_output, config.max_output_tokens_cap)
    seed = get_int(body, "seed", minimum=0, maximum=SEED_MAX)
    background = get_bool(body, "background")
    stream = get_bool(body, "stream")
    store = get_bool(body, "store", default=True)
    if background and not store:
        raise InvalidRequest("a background response must be stored ('store' cannot be false)", param="store")
    on_restart = get_str(body, "on_restart", default=config.default_on_restart)
    if on_restart not in RESTART_POLICIES:
        raise InvalidRequest(f"'on_restart' must be one of {', '.join(RESTART_POLICIES)}", param="on_restart")
    request = {
        "model": model,
        "input": given,
        "instructions": instructions,
        "max_output_tokens": max_output,
        "temperature": get_number(body, "temperature", default=1.0, minimum=0, maximum=2),
        "top_p": get_number(body, "top_p", default=1.0, exclusive_minimum=0, maximum=1),
        "top_k": get_int(body, "top_k", default=0, minimum=0, maximum=2**31 - 1),
        "seed": random_seed() if seed is None else seed,
        "stop": parse_stop(body.get("stop")),
        "stream": stream,
        "background": background,
        "store": store,
        "on_restart": on_restart,
        "metadata": parse_metadata(body.get("metadata")),
        **options.parse_options(body),
        **tools.tools_and_format(body),
        **earlier.fields(calls),
    }
    return CreateRequest(
        client_id=None,
        model=model,
        messages=messages,
        request=request,
        on_restart=on_restart,
        background=background,
        stream=stream,
        store=store,
        items=input_items(body["input"], new_id),
        conversation=earlier.conversation,
    )
