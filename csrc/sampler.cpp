#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#if defined(__AVX__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace lmsp {
namespace {

uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

// The largest logit, -inf when there is no number at all (a NaN compares
// false, so it is never taken). Vector max instructions where the module is
// built for them: max(v, acc) returns acc when v is NaN, which is exactly
// v > acc ? v : acc. (Compilers leave the portable loop scalar: 6.5 us for
// 32,000 logits against 1.7 with AVX-512.)
float max_value(const float * logits, int32_t n) {
    int32_t i = 0;
    float best = -INFINITY;
#if defined(__AVX512F__)
    __m512 a0 = _mm512_set1_ps(-INFINITY), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_max_ps(_mm512_loadu_ps(logits + i), a0);
        a1 = _mm512_max_ps(_mm512_loadu_ps(logits + i + 16), a1);
        a2 = _mm512_max_ps(_mm512_loadu_ps(logits + i + 32), a2);
        a3 = _mm512_max_ps(_mm512_loadu_ps(logits + i + 48), a3);
    }
    best = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(a0, a1), _mm512_max_ps(a2, a3)));
#elif defined(__AVX__)
    __m256 a0 = _mm256_set1_ps(-INFINITY), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_max_ps(_mm256_loadu_ps(logits + i), a0);
        a1 = _mm256_max_ps(_mm256_loadu_ps(logits + i + 8), a1);
        a2 = _mm256_max_ps(_mm256_loadu_ps(logits + i + 16), a2);
        a3 = _mm256_max_ps(_mm256_loadu_ps(logits + i + 24), a3);
    }
    alignas(32) float lane[8];
    _mm256_store_ps(lane, _mm256_max_ps(_mm256_max_ps(a0, a1), _mm256_max_ps(a2, a3)));
    for (const float v : lane) best = v > best ? v : best;
#endif
    for (; i < n; ++i) best = logits[i] > best ? logits[i] : best;
    return best;
}

// Whether any of the 64 logits at p is >= bar (a NaN is not), in vector
// compares where the module is built for them.
bool any_at_least_64(const float * p, float bar) {
#if defined(__AVX512F__)
    const __m512 b = _mm512_set1_ps(bar);
    const __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(p), b, _CMP_GE_OQ) |
                        _mm512_cmp_ps_mask(_mm512_loadu_ps(p + 16), b, _CMP_GE_OQ) |
                        _mm512_cmp_ps_mask(_mm512_loadu_ps(p + 32), b, _CMP_GE_OQ) |
                        _mm512_cmp_ps_mask(_mm512_loadu_ps(p + 48), b, _CMP_GE_OQ);
    return m != 0;
#elif defined(__AVX__)
    const __m256 b = _mm256_set1_ps(bar);
    __m256 m = _mm256_cmp_ps(_mm256_loadu_ps(p), b, _CMP_GE_OQ);
    for (int j = 8; j < 64; j += 8) m = _mm256_or_ps(m, _mm256_cmp_ps(_mm256_loadu_ps(p + j), b, _CMP_GE_OQ));
    return _mm256_movemask_ps(m) != 0;
#else
    int hit = 0;
    for (int j = 0; j < 64; ++j) hit |= p[j] >= bar;
    return hit != 0;
#endif
}

// The highest logit's id (NaN never wins; ties keep the lowest id): the
// maximum, then the first id holding it, found a block at a time (a loop
// with an early exit does not vectorize; one over a block does). No number
// at all: id 0.
int32_t argmax(const float * logits, int32_t n) {
    const float best = max_value(logits, n);
    constexpr int32_t kBlock = 64;
    int32_t i = 0;
    for (; i + kBlock <= n; i += kBlock) {
        int hit = 0;
        for (int32_t j = 0; j < kBlock; ++j) hit |= logits[i + j] == best;
        if (hit) break;
    }
    for (; i < n; ++i) {
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

// a * b + c in one rounding where the build has FMA instructions, so that the
// scalar and the vector code below round alike (and the compiler finds
// nothing left to fuse in its own way).
inline float mul_add(float a, float b, float c) {
#if defined(__FMA__)
    return std::fma(a, b, c);
#else
    return a * b + c;
#endif
}

// e^x for x <= 0: x = k ln 2 + r with |r| <= ln 2 / 2, e^r by Cephes' degree-5
// polynomial for expf (within about 1 ulp), 2^k through the exponent bits;
// below -87 (and for -inf and NaN) the result is 0. exp_weights below is the
// same, operation for operation, in vector registers.
inline float exp_nonpositive(float x) {
    const bool inside = x > -87.0f;  // false for -inf and NaN too
    x = inside ? x : -87.0f;
    const int32_t k = int32_t(mul_add(x, 1.44269504088896341f, -0.5f));  // nearest integer, x <= 0
    const float kf = float(k);
    const float r = mul_add(kf, 2.12194440e-4f, mul_add(-kf, 0.693359375f, x));
    float p = 1.9875691500e-4f;
    p = mul_add(p, r, 1.3981999507e-3f);
    p = mul_add(p, r, 8.3334519073e-3f);
    p = mul_add(p, r, 4.1665795894e-2f);
    p = mul_add(p, r, 1.6666665459e-1f);
    p = mul_add(p, r, 5.0000001201e-1f);
    p = mul_add(p * r, r, r) + 1.0f;
    const int32_t bits = (k + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return inside ? p * scale : 0.0f;
}

// w[i] = exp_nonpositive((logits[i] - m) * inv_t) for i < n, the same values
// bit for bit; vector registers where the build has them (compilers leave the
// scalar loop scalar: the select and the conversions stop them).
void exp_weights(const float * logits, float * w, int32_t n, float m, float inv_t) {
    int32_t i = 0;
#if defined(__AVX512F__) && defined(__FMA__)
    const __m512 vm = _mm512_set1_ps(m), vt = _mm512_set1_ps(inv_t), floor = _mm512_set1_ps(-87.0f);
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(logits + i), vm), vt);
        const __mmask16 inside = _mm512_cmp_ps_mask(x, floor, _CMP_GT_OQ);
        x = _mm512_mask_blend_ps(inside, floor, x);
        const __m512i k = _mm512_cvttps_epi32(
            _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(-0.5f)));
        const __m512 kf = _mm512_cvtepi32_ps(k);
        const __m512 r = _mm512_fmadd_ps(kf, _mm512_set1_ps(2.12194440e-4f),
                                         _mm512_fnmadd_ps(kf, _mm512_set1_ps(0.693359375f), x));
        __m512 p = _mm512_set1_ps(1.9875691500e-4f);
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
        p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
        const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k, _mm512_set1_epi32(127)), 23));
        _mm512_storeu_ps(w + i, _mm512_maskz_mul_ps(inside, p, scale));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256 vm = _mm256_set1_ps(m), vt = _mm256_set1_ps(inv_t), floor = _mm256_set1_ps(-87.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(logits + i), vm), vt);
        const __m256 inside = _mm256_cmp_ps(x, floor, _CMP_GT_OQ);
        x = _mm256_blendv_ps(floor, x, inside);
        const __m256i k = _mm256_cvttps_epi32(
            _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(-0.5f)));
        const __m256 kf = _mm256_cvtepi32_ps(k);
        const __m256 r = _mm256_fmadd_ps(kf, _mm256_set1_ps(2.12194440e-4f),
                                         _mm256_fnmadd_ps(kf, _mm256_set1_ps(0.693359375f), x));
        __m256 p = _mm256_set1_ps(1.9875691500e-4f);
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
        p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
        const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
        _mm256_storeu_ps(w + i, _mm256_and_ps(_mm256_mul_ps(p, scale), inside));
    }
#endif
    for (; i < n; ++i) w[i] = exp_nonpositive((logits[i] - m) * inv_t);  // NaN, -inf: 0
}

}  // namespace

double counter_uniform(uint64_t seed, uint64_t counter) {
    const uint64_t r = splitmix64(splitmix64(seed) ^ splitmix64(counter + 0x632BE59BD9B4E019ULL));
    return double(r >> 11) * (1.0 / 9007199254740992.0);  // 53 bits
}

// Temperature alone: every token is a candidate, in id order, so no keys and
// no sorting; one pass for the maximum, one for the weights, one for the
// blocks' masses, one scan for the draw.
int32_t Sampler::sample_all(const float * logits, int32_t n_vocab, uint64_t index) {
    const float max_logit = max_value(logits, n_vocab);
    if (!std::isfinite(max_logit)) {
        return argmax(logits, n_vocab);
    }
    const float inv_t = 1.0f / params_.temperature;
    weights_.resize(size_t(n_vocab));
    float * w = weights_.data();
    exp_weights(logits, w, n_vocab, max_logit, inv_t);
    int32_t i = 0;
    // The mass of each block of 256 tokens (vectorized), then the draw walks
    // the blocks and scans only the one where the cumulative mass passes it.
    constexpr int32_t kBlock = 256;
    const int32_t n_blocks = (n_vocab + kBlock - 1) / kBlock;
    block_mass_.resize(size_t(n_blocks));
    double total = 0.0;
    for (int32_t b = 0; b < n_blocks; ++b) {
        const int32_t lo = b * kBlock, hi = std::min(n_vocab, lo + kBlock);
        double lanes[8] = {};
        i = lo;
#if defined(__AVX512F__)
        __m512d acc = _mm512_setzero_pd();  // lane j: lanes[j], summed in the same order
        for (; i + 8 <= hi; i += 8) acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_loadu_ps(w + i)));
        _mm512_storeu_pd(lanes, acc);
#elif defined(__AVX__)
        __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
        for (; i + 8 <= hi; i += 8) {
            acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm_loadu_ps(w + i)));
            acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm_loadu_ps(w + i + 4)));
        }
        _mm256_storeu_pd(lanes, acc0);
        _mm256_storeu_pd(lanes + 4, acc1);
#else
        for (; i + 8 <= hi; i += 8) {
            for (int32_t j = 0; j < 8; ++j) lanes[j] += double(w[i + j]);
        }
#endif
        double mass = 0.0;
        for (; i < hi; ++i) mass += double(w[i]);
        for (const double v : lanes) mass += v;
        block_mass_[size_t(b)] = mass;
        total += mass;
    }

    const double u = counter_uniform(params_.seed, index) * total;
    double cum = 0.0;
    for (int32_t b = 0; b < n_blocks; ++b) {
        const double mass = block_mass_[size_t(b)];
        if (!(u < cum + mass) && b + 1 < n_blocks) {
            cum += mass;
            continue;
        }
        const int32_t lo = b * kBlock, hi = std::min(n_vocab, lo + kBlock);
        for (i = lo; i < hi; ++i) {
            cum += double(w[i]);
            if (u < cum) return i;
        }
        for (i = hi; i-- > lo;) {  // rounding at the block's end: its last token with mass
            if (w[i] > 0.0f) return i;
        }
        break;
    }
    return argmax(logits, n_vocab);
}

// keys_ = the k best candidates (0 < k < n_vocab) in ascending key order: what
// partial_sort of every token's key gives, without a key per token. A heap of k
// keys holds the best so far, the worst on top; a later token (a larger id)
// beats it only with a logit at least as high (equal floats, such as -0 and +0,
// go to the keys to decide), which a vectorized pass tests 64 logits at a time.
// A NaN never passes that test, as its key (-inf, a larger id) never wins.
void Sampler::select_top_k(const float * logits, int32_t n_vocab, size_t k) {
    keys_.resize(k);
    for (size_t i = 0; i < k; ++i) keys_[i] = sort_key(logits, int32_t(i));
    std::make_heap(keys_.begin(), keys_.end());
    auto bar = [&] {
        const float l = logits[key_id(keys_.front())];
        return std::isnan(l) ? -INFINITY : l;
    };
    float worst = bar();
    auto consider = [&](int32_t id) {
        if (!(logits[id] >= worst)) return;
        const uint64_t key = sort_key(logits, id);
        if (key >= keys_.front()) return;
        std::pop_heap(keys_.begin(), keys_.end());
        keys_.back() = key;
        std::push_heap(keys_.begin(), keys_.end());
        worst = bar();
    };
    constexpr int32_t kBlock = 64;
    int32_t i = int32_t(k);
    for (; i + kBlock <= n_vocab; i += kBlock) {
        if (any_at_least_64(logits + i, worst)) {
            for (int32_t j = 0; j < kBlock; ++j) consider(i + j);
        }
    }
    for (; i < n_vocab; ++i) consider(i);
    std::sort_heap(keys_.begin(), keys_.end());
}

int32_t Sampler::sample(const float * logits, int32_t n_vocab, uint64_t index) {
    if (n_vocab <= 0) {
        return 0;
    }
    if (!(params_.temperature > 0.0f)) {
        return argmax(logits, n_vocab);
    }

    if (!(params_.top_k > 0 && params_.top_k < n_vocab) && !(params_.top_p < 1.0f)) {
        return sample_all(logits, n_vocab, index);
    }

    // Candidates, ordered by (logit desc, id asc) whenever an order matters.
    size_t n;
    bool ordered;
    if (params_.top_k > 0 && params_.top_k < n_vocab) {
        n = size_t(params_.top_k);
        select_top_k(logits, n_vocab, n);
        ordered = true;
    } else {
        keys_.resize(size_t(n_vocab));
        for (int32_t i = 0; i < n_vocab; ++i) keys_[size_t(i)] = sort_key(logits, i);
        n = keys_.size();
        ordered = false;  // id order, the order keys_ was built in
    }
    const auto first = keys_.begin();

    // Softmax at the temperature, in double, in candidate order.
    const int32_t top = ordered ? key_id(keys_[0]) : key_id(*std::min_element(first, keys_.end()));
    if (!std::isfinite(logits[top])) {
        return argmax(logits, n_vocab);
    }
    // the weights in float (within about 1 ulp, exp_nonpositive), the sums in double
    const float max_logit = logits[top];
    const float inv_t = 1.0f / params_.temperature;
    auto weight = [&](uint64_t key) {
        return double(exp_nonpositive((logits[key_id(key)] - max_logit) * inv_t));  // NaN: 0
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
        // (The mass may be reached at the last candidate: keep == n then, so
        // whether it was reached is a flag of its own.)
        const double target = double(params_.top_p) * total;
        double cum = 0.0;
        size_t keep = n, sorted = ordered ? n : 0, i = 0;
        bool reached = false;
        for (size_t block = 64; !reached && i < n; block *= 4) {
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
                    reached = true;
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
