// Log probabilities of a position's distribution (logprobs.h).
#include "logprobs.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace lmsp {

// ln softmax(logits)[token], summed in double.
float log_probability(const float * logits, int32_t n, int32_t token) {
    float top = -INFINITY;
    for (int32_t i = 0; i < n; ++i) top = std::max(top, logits[i]);
    double sum = 0.0;
    for (int32_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - double(top));
    return float(double(logits[token]) - double(top) - std::log(sum));
}

std::vector<TopLogprob> top_logprobs(const float * logits, int32_t n, int32_t k) {
    k = std::clamp(k, 0, n);
    float top = -INFINITY;
    for (int32_t i = 0; i < n; ++i) top = std::max(top, logits[i]);
    double sum = 0.0;
    for (int32_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - double(top));
    const double norm = double(top) + std::log(sum);  // as log_probability computes it
    std::vector<int32_t> ids(size_t(n), 0);
    for (int32_t i = 0; i < n; ++i) ids[size_t(i)] = i;
    const auto more_likely = [logits](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), more_likely);
    std::vector<TopLogprob> out;
    out.reserve(size_t(k));
    for (int32_t i = 0; i < k; ++i) {
        const int32_t id = ids[size_t(i)];
        if (!(logits[id] > -INFINITY)) break;  // a token masked out (a grammar's) is no alternative
        out.push_back({id, float(double(logits[id]) - norm)});
    }
    return out;
}

}  // namespace lmsp
