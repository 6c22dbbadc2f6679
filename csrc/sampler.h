// Counter-based sampling: the random draw for output token i depends only on
// (seed, i), so a sequence samples the same tokens alone or batched with
// others, and a resumed sequence continues exactly where it stopped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lmsp {

struct SamplingParams {
    float temperature = 1.0f;  // 0 = greedy
    float top_p = 1.0f;        // (0, 1]
    int32_t top_k = 0;         // 0 = off
    uint64_t seed = 0;
};

// A uniform double in [0, 1) from (seed, counter), by splitmix64.
double counter_uniform(uint64_t seed, uint64_t counter);

class Sampler {
public:
    explicit Sampler(const SamplingParams & params) : params_(params) {}

    // Picks a token from logits[0..n_vocab) for output position `index`.
    // Pure: the same logits, params and index give the same token.
    int32_t sample(const float * logits, int32_t n_vocab, uint64_t index);

private:
    int32_t sample_all(const float * logits, int32_t n_vocab, uint64_t index);
    void select_top_k(const float * logits, int32_t n_vocab, size_t k);

    SamplingParams params_;
    // scratch, reused between calls: candidates as sort keys (see sampler.cpp)
    std::vector<uint64_t> keys_;
    std::vector<double> probs_;
    std::vector<float> weights_;
    std::vector<double> block_mass_;
};

}  // namespace lmsp
