// The prefix cache's choice of a slot: which KV stream a new sequence takes,
// and how much of the KV a free slot kept it may continue from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lmsp {

// One KV stream of the engine; a free one keeps its last sequence's KV.
struct Slot {
    bool used = false;
    std::vector<int32_t> tokens;  // the tokens at the KV's positions 0..
    std::string key;              // the cache_key of the sequence that left them
    uint64_t freed_at = 0;        // the engine's slot clock when it was last given up
    size_t tiled_rows = 0;        // leading positions computed by a tiled prefill
    size_t tiled_min = 0;         // ... in chunks of at least this many rows
    int64_t save_seq = 0;         // a persisted sequence whose KV it holds, not saved yet (0: none)
    size_t state_size = 0;        // ... the size of its state
    // the engine keeps the logits of position logits_rows - 1, the last row of
    // the prompt whose prefill computed it, while positions 0 to that one hold
    // the KV that gave them (0: none kept)
    size_t logits_rows = 0;
};

// The slot a new sequence takes (see slot_choice.cpp); `common` is set to the
// leading tokens of `tokens` that the slot's KV holds (0 when none is reused).
// `tokens` null: no reuse, only a free slot. Of slots that hold as much, one
// that kept the logits of exactly `tokens` (a prompt asked again) comes first.
int pick_slot(const std::vector<Slot> & slots, const std::vector<int32_t> * tokens, const std::string & key,
              size_t & common);

// How many of the `common` leading positions a new sequence may take over
// when rows are computed in two ways (tiled prefill, one-row decode).
size_t same_kind_prefix(size_t common, size_t t_slot, size_t m_slot, size_t t_new, size_t m_new);

// How many of `common` leading rows of a KV (a slot's, or a KvPrefix's: the
// first `t_held` of them tiled in chunks of at least `m_held`) a sequence
// fed `n_feed` tokens (the first `t_new` tiled, chunks of `m_new`) continues
// from: its last token is fed again in any case, and with two kinds of rows
// only rows computed as its own prefill would compute them are taken.
size_t usable_rows(size_t common, size_t n_feed, bool two_kinds, size_t t_held, size_t m_held, size_t t_new,
                   size_t m_new);

}  // namespace lmsp
