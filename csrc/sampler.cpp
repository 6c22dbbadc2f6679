#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <cstddef>

namespace lmsp {
namespace {

uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

int32_t argmax(const float * logits, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; ++i) {
        // NaN never wins; ties keep the lowest id
        if (logits[i] > logits[best] || std::isnan(logits[best])) {
            best = i;
        }
    }
    return best;
}

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
    ids_.resize(size_t(n_vocab));
    std::iota(ids_.begin(), ids_.end(), 0);
    auto by_logit = [logits](int32_t a, int32_t b) {
        const float la = std::isnan(logits[a]) ? -INFINITY : logits[a];
        const float lb = std::isnan(logits[b]) ? -INFINITY : logits[b];
        return la > lb || (la == lb && a < b);
    };
    size_t n = ids_.size();
    const bool need_sort = params_.top_p < 1.0f;
    if (params_.top_k > 0 && size_t(params_.top_k) < n) {
        n = size_t(params_.top_k);
        std::partial_sort(ids_.begin(), ids_.begin() + std::ptrdiff_t(n), ids_.end(), by_logit);
        ids_.resize(n);
    } else if (need_sort) {
        std::sort(ids_.begin(), ids_.end(), by_logit);
    }

    // Softmax at the temperature, in double, in candidate order.
    double max_logit = -INFINITY;
    for (size_t i = 0; i < n; ++i) {
        const float l = logits[ids_[i]];
        if (!std::isnan(l)) max_logit = std::max(max_logit, double(l));
    }
    if (!std::isfinite(max_logit)) {
        return argmax(logits, n_vocab);
    }
    const double inv_t = 1.0 / double(params_.temperature);
    probs_.resize(n);
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const float l = logits[ids_[i]];
        const double p = std::isnan(l) ? 0.0 : std::exp((double(l) - max_logit) * inv_t);
        probs_[i] = p;
        total += p;
    }

    if (need_sort) {
        // smallest prefix (in descending order) whose mass reaches top_p
        const double target = double(params_.top_p) * total;
        double cum = 0.0;
        size_t keep = n;
        for (size_t i = 0; i < n; ++i) {
            cum += probs_[i];
            if (cum >= target) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        total = 0.0;
        for (size_t i = 0; i < n; ++i) total += probs_[i];
    }

    const double u = counter_uniform(params_.seed, index) * total;
    double cum = 0.0;
    for (size_t i = 0; i < n; ++i) {
        cum += probs_[i];
        if (u < cum) {
            return ids_[i];
        }
    }
    // rounding at the very top: the last candidate with mass
    for (size_t i = n; i-- > 0;) {
        if (probs_[i] > 0.0) return ids_[i];
    }
    return ids_[0];
}

}  // namespace lmsp
