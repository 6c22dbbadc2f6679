// A sequence as the engine's own thread keeps it, from its submission to its
// end (the files of the engine only; callers see its id and results).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine.h"
#include "grammar.h"
#include "logprobs.h"
#include "sampler.h"
#include "text.h"

namespace lmsp {

using Clock = std::chrono::steady_clock;

// The life of a sequence: waiting for a slot, prefilling its prompt in chunks,
// generating one token per step, finished.
enum class SeqState { waiting, prefilling, generating, finished };

struct Sequence {
    int64_t id = 0;
    SeqState state = SeqState::waiting;
    int slot = -1;

    std::vector<int32_t> feed;  // tokens to prefill (prompt, plus generated when resumed without KV)
    size_t n_fed = 0;
    int32_t n_prompt = 0;
    int32_t n_past = 0;                // positions in this sequence's KV
    int32_t n_cached = 0;              // leading feed tokens whose KV its slot already held
    size_t t_end = 0;                  // feed tokens [0, t_end) are prefilled in tiled steps
    size_t t_min = 0;                  // ... in chunks of at least this many rows
    std::string cache_key;             // whose slots' KV it may reuse
    bool logprobs = false;             // hand out each token's log probability
    std::vector<float> next_logprobs;  // for the token of the next result

    // with logprobs: this many most likely tokens at each position, for the next result
    int32_t top_logprobs = 0;
    std::vector<std::vector<TopLogprob>> next_top;

    std::vector<int32_t> generated;
    int32_t max_tokens = 0;
    Sampler sampler;
    std::unique_ptr<Grammar> grammar;  // null: unconstrained
    std::vector<float> masked;         // the logits the grammar allows (scratch)
    TextStream text;
    std::optional<std::vector<uint8_t>> kv_state;  // applied on admission
    std::optional<KvPrefix> prefix;                // loaded on admission when it gives more than a slot
    int32_t n_loaded = 0;                          // leading tokens the prefix gave
    bool prefix_refused = false;
    bool persist = false;  // its KV is kept for saved_prefix()

    int batch_index = -1;  // row of its logits in the current batch, -1 if none
    Clock::time_point t_submit, t_admit, t_first;
    bool has_first = false;
    bool reported = false;  // a result with text has been handed out

    Sequence(const SamplingParams & sp, std::vector<std::string> stops) : sampler(sp), text(std::move(stops)) {}
};

}  // namespace lmsp
