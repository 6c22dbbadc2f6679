#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

namespace lmsp {
namespace {

uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

// The highest logit's id (NaN never wins; ties keep the lowest id). Two
// passes the compiler vectorizes: the maximum (a NaN compares false, so it is
// never taken), then the first id holding it. No number at all: id 0.
int32_t argmax(const float * logits, int32_t n) {
    constexpr int32_t kLanes = 16;
    float lane[kLanes];
    for (float & v : lane) v = -INFINITY;
    int32_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        for (int32_t j = 0; j < kLanes; ++j) {
            const float v = logits[i + j];
            lane[j] = v > lane[j] ? v : lane[j];
        }
    }
    float best = -INFINITY;
    for (; i < n; ++i) best = logits[i] > best ? logits[i] : best;
    for (const float v : lane) best = v > best ? v : best;
    for (i = 0; i < n; ++i) {
        if (logits[i] == best) return i;
    }
    return 0;
}

// A candidate as one integer whose ascending order is (logit descending, id
// ascending), NaN counting as -inf: sorting and selecting on these is a plain
// integer comparison instead of a comparator that reads the logits.
uint64_t sort_key(const float * logits, int32_t id) {
    float l = logits[id];
    if (std::isnan(l)) l = -INFINITY;
    uint32_t bits;
    std::memcpy(&bits, &l, sizeof bits);
    bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);  // ascending with the float
    return (uint64_t(~bits) << 32) | uint32_t(id);
}

int32_t key_id(uint64_t key) { return int32_t(key & 0xffffffffu); }

}  // namespace

double counter_uniform(uint64_t seed, uint64_t counter) {
    const uint64_t r = splitmix64(splitmix64(seed) ^ splitmix64(counter + 0x632BE59BD9B4E019ULL));
    return double(r >> 11) * (1.0 / 9007199254740992.0);  // 53 bits
}

int32_t Sampler::sample(const float * logits, int32_t n_vocab, uint64_t index) {
    if (n_vocab <= 0) {
        return 0;
    }
    if (!(params_.temperature > 0.0f)) {
        return argmax(logits, n_vocab);
    }

    // Candidates, ordered by (logit desc, id asc) whenever an order matters.
    keys_.resize(size_t(n_vocab));
    for (int32_t i = 0; i < n_vocab; ++i) keys_[size_t(i)] = sort_key(logits, i);
    const auto first = keys_.begin();
    size_t n = keys_.size();
    if (params_.top_k > 0 && size_t(params_.top_k) < n) {
        // the k best, in order (a heap of k: most candidates cost one comparison)
        n = size_t(params_.top_k);
        std::partial_sort(first, first + std::ptrdiff_t(n), keys_.end());
    }
    const bool ordered = n < keys_.size();  // else: id order, the order keys_ was built in

    // Softmax at the temperature, in double, in candidate order.
    const int32_t top = ordered ? key_id(keys_[0]) : key_id(*std::min_element(first, keys_.end()));
    if (!std::isfinite(logits[top])) {
        return argmax(logits, n_vocab);
    }
    // exp in float (each weight within 1e-7 of the double one, at a fraction
    // of the cost over a whole vocabulary); the sums stay in double
    const float max_logit = logits[top];
    const float inv_t = 1.0f / params_.temperature;
    auto weight = [&](uint64_t key) {
        const float l = logits[key_id(key)];
        return std::isnan(l) ? 0.0 : double(std::exp((l - max_logit) * inv_t));
    };
    probs_.resize(n);
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) {
        probs_[i] = weight(keys_[i]);
        total += probs_[i];
    }

    if (params_.top_p < 1.0f) {
        // The smallest prefix (in descending order) whose mass reaches top_p.
        // Only that prefix needs an order: sort growing blocks of the best
        // candidates until the mass is reached, instead of all of them.
        const double target = double(params_.top_p) * total;
        double cum = 0.0;
        size_t keep = n, sorted = ordered ? n : 0, i = 0;
        for (size_t block = 64; keep == n && i < n; block *= 4) {
            if (sorted < n) {
                const size_t hi = std::min(n, sorted + block);
                std::partial_sort(first + std::ptrdiff_t(sorted), first + std::ptrdiff_t(hi),
                                  first + std::ptrdiff_t(n));
                sorted = hi;
            }
            for (; i < sorted; ++i) {
                probs_[i] = weight(keys_[i]);
                cum += probs_[i];
                if (cum >= target) {
                    keep = i + 1;
                    break;
                }
            }
        }
        n = keep;
        total = 0.0;
        for (size_t j = 0; j < n; ++j) total += probs_[j];
    }

    const double u = counter_uniform(params_.seed, index) * total;
    double cum = 0.0;
    for (size_t i = 0; i < n; ++i) {
        cum += probs_[i];
        if (u < cum) {
            return key_id(keys_[i]);
        }
    }
    // rounding at the very top: the last candidate with mass
    for (size_t i = n; i-- > 0;) {
        if (probs_[i] > 0.0) return key_id(keys_[i]);
    }
    return key_id(keys_[0]);
}

}  // namespace lmsp
