// Log probabilities handed out with generated tokens.
#pragma once

#include <cstdint>
#include <vector>

namespace lmsp {

// The most log probabilities a sequence may ask for at each position.
constexpr int32_t kMaxTopLogprobs = 20;

// One of the most likely tokens at a position, with its natural log probability.
struct TopLogprob {
    int32_t token = 0;
    float logprob = 0;
};

// ln softmax(logits)[token] over `n` logits, summed in double.
float log_probability(const float * logits, int32_t n, int32_t token);

// The `k` most likely tokens of the distribution `logits` (a softmax over `n`),
// most likely first; ties go to the lower token id. Tokens at -inf (masked out)
// are left out, so fewer than `k` may come back.
std::vector<TopLogprob> top_logprobs(const float * logits, int32_t n, int32_t k);

}  // namespace lmsp
