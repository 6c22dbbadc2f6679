"""``truncation: "auto"``'s arithmetic, which the chat template's prompt
(:mod:`.prompt`) and the chat layer's (:mod:`.chat_layer`) share: how many
prompt tokens may stay, and the fewest oldest turns to drop."""

from __future__ import annotations

from typing import Callable


def budget(n_ctx: int, max_tokens: int) -> int:
    """The most prompt tokens ``truncation: "auto"`` leaves: room for ``max_tokens`` of
    output, at most half the context."""
    return n_ctx - max(1, min(max_tokens, n_ctx // 2))


def fewest_dropped(
    tokens: list[int], without: Callable[[int], list[int]], n_turns: int, most: int
) -> tuple[list[int], int]:
    """The prompt (``tokens``) less the fewest of its oldest turns (``without(n)``: less
    ``n`` of its ``n_turns``) that fits in ``most`` tokens, and how many went; found in
    a logarithmic number of renders (a prompt never grows when a turn goes). The last
    turn always stays: the shortest there is when none fits."""
    low, high = 1, n_turns - 1
    if len(tokens) <= most or high < low:
        return tokens, 0
    best = without(high)
    while low < high:
        middle = (low + high) // 2
        attempt = without(middle)
        if len(attempt) <= most:
            high, best = middle, attempt
        else:
            low = middle + 1
    return best, high  # best is without(high): the one that fits, or the shortest there is
