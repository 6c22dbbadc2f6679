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

// The operations of the loops below, on one float or on a vector register of
// Width floats: each loop is written once, for Scalar and for the vector
// registers the module is built for (Native). Compilers leave these loops
// scalar (the selects and conversions stop them), and each vector operation
// rounds as its scalar one: max(a, b) is a > b ? a : b (a NaN a gives b), the
// compares are ordered (false for NaN), fma is one rounding.
struct Scalar {
    using F = float;
    using I = int32_t;
    using M = bool;
    static constexpr int32_t Width = 1;
    static F load(const float * p) { return *p; }
    static void store(float * p, F v) { *p = v; }
    static F set(float v) { return v; }
    static F add(F a, F b) { return a + b; }
    static F sub(F a, F b) { return a - b; }
    static F mul(F a, F b) { return a * b; }
    static F fma(F a, F b, F c) { return mul_add(a, b, c); }
    static F fnma(F a, F b, F c) { return mul_add(-a, b, c); }
    static F max(F a, F b) { return a > b ? a : b; }
    static M greater(F a, F b) { return a > b; }
    static M at_least(F a, F b) { return a >= b; }
    static M either(M a, M b) { return a || b; }
    static bool any(M m) { return m; }
    static F select(M m, F yes, F no) { return m ? yes : no; }
    static F zero_unless(M m, F v) { return m ? v : 0.0f; }
    static I trunc(F a) { return int32_t(a); }
    static F to_float(I k) { return float(k); }
    static F pow2(I k) {  // 2^k through the exponent bits
        const int32_t bits = (k + 127) << 23;
        float v;
        std::memcpy(&v, &bits, sizeof v);
        return v;
    }
    static float reduce_max(F a) { return a; }
};

#if defined(__AVX512F__) && defined(__FMA__)
struct Avx512 {
    using F = __m512;
    using I = __m512i;
    using M = __mmask16;
    static constexpr int32_t Width = 16;
    static F load(const float * p) { return _mm512_loadu_ps(p); }
    static void store(float * p, F v) { _mm512_storeu_ps(p, v); }
    static F set(float v) { return _mm512_set1_ps(v); }
    static F add(F a, F b) { return _mm512_add_ps(a, b); }
    static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
    static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
    static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
    static F fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
    static F max(F a, F b) { return _mm512_max_ps(a, b); }
    static M greater(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
    static M at_least(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
    static M either(M a, M b) { return M(a | b); }
    static bool any(M m) { return m != 0; }
    static F select(M m, F yes, F no) { return _mm512_mask_blend_ps(m, no, yes); }
    static F zero_unless(M m, F v) { return _mm512_maskz_mov_ps(m, v); }
    static I trunc(F a) { return _mm512_cvttps_epi32(a); }
    static F to_float(I k) { return _mm512_cvtepi32_ps(k); }
    static F pow2(I k) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k, _mm512_set1_epi32(127)), 23));
    }
    static float reduce_max(F a) { return _mm512_reduce_max_ps(a); }
};
using Native = Avx512;
#elif defined(__AVX2__) && defined(__FMA__)
struct Avx2 {
    using F = __m256;
    using I = __m256i;
    using M = __m256;
    static constexpr int32_t Width = 8;
    static F load(const float * p) { return _mm256_loadu_ps(p); }
    static void store(float * p, F v) { _mm256_storeu_ps(p, v); }
    static F set(float v) { return _mm256_set1_ps(v); }
    static F add(F a, F b) { return _mm256_add_ps(a, b); }
    static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
    static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
    static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
    static F fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
    static F max(F a, F b) { return _mm256_max_ps(a, b); }
    static M greater(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
    static M at_least(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
    static M either(M a, M b) { return _mm256_or_ps(a, b); }
    static bool any(M m) { return _mm256_movemask_ps(m) != 0; }
    static F select(M m, F yes, F no) { return _mm256_blendv_ps(no, yes, m); }
    static F zero_unless(M m, F v) { return _mm256_and_ps(v, m); }
    static I trunc(F a) { return _mm256_cvttps_epi32(a); }
    static F to_float(I k) { return _mm256_cvtepi32_ps(k); }
    static F pow2(I k) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
    }
    static float reduce_max(F a) {
        alignas(32) float lane[8];
        _mm256_store_ps(lane, a);
        float best = lane[0];
        for (const float v : lane) best = v > best ? v : best;
        return best;
    }
};
using Native = Avx2;
#else
using Native = Scalar;
#endif

// The largest logit, -inf when there is no number at all (a NaN compares
// false, so it is never taken).
float max_value(const float * logits, int32_t n) {
    using V = Native;
    constexpr int32_t W = V::Width;
    int32_t i = 0;
    typename V::F a0 = V::set(-INFINITY), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 4 * W <= n; i += 4 * W) {
        a0 = V::max(V::load(logits + i), a0);
        a1 = V::max(V::load(logits + i + W), a1);
        a2 = V::max(V::load(logits + i + 2 * W), a2);
        a3 = V::max(V::load(logits + i + 3 * W), a3);
    }
    float best = V::reduce_max(V::max(V::max(a0, a1), V::max(a2, a3)));
    for (; i < n; ++i) best = logits[i] > best ? logits[i] : best;
    return best;
}

// Whether any of the 64 logits at p is >= bar (a NaN is not).
bool any_at_least_64(const float * p, float bar) {
    using V = Native;
    const typename V::F b = V::set(bar);
    typename V::M m = V::at_least(V::load(p), b);
    for (int32_t j = V::Width; j < 64; j += V::Width) m = V::either(m, V::at_least(V::load(p + j), b));
    return V::any(m);
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

// e^x for x <= 0: x = k ln 2 + r with |r| <= ln 2 / 2, e^r by Cephes' degree-5
// polynomial for expf (within about 1 ulp), 2^k through the exponent bits;
// below -87 (and for -inf and NaN) the result is 0. For one float or a vector.
template <class V>
typename V::F exp_nonpositive_v(typename V::F x) {
    const typename V::F floor = V::set(-87.0f);
    const typename V::M inside = V::greater(x, floor);  // false for -inf and NaN too
    x = V::select(inside, x, floor);
    const typename V::I k = V::trunc(V::fma(x, V::set(1.44269504088896341f), V::set(-0.5f)));  // nearest, x <= 0
    const typename V::F kf = V::to_float(k);
    const typename V::F r = V::fma(kf, V::set(2.12194440e-4f), V::fnma(kf, V::set(0.693359375f), x));
    typename V::F p = V::set(1.9875691500e-4f);
    p = V::fma(p, r, V::set(1.3981999507e-3f));
    p = V::fma(p, r, V::set(8.3334519073e-3f));
    p = V::fma(p, r, V::set(4.1665795894e-2f));
    p = V::fma(p, r, V::set(1.6666665459e-1f));
    p = V::fma(p, r, V::set(5.0000001201e-1f));
    p = V::add(V::fma(V::mul(p, r), r, r), V::set(1.0f));
    return V::zero_unless(inside, V::mul(p, V::pow2(k)));
}

inline float exp_nonpositive(float x) { return exp_nonpositive_v<Scalar>(x); }

// w[i] = exp_nonpositive((logits[i] - m) * inv_t) for i < n: the same values bit
// for bit, in vector registers where the build has them.
void exp_weights(const float * logits, float * w, int32_t n, float m, float inv_t) {
    using V = Native;
    int32_t i = 0;
    for (; i + V::Width <= n; i += V::Width) {
        V::store(w + i, exp_nonpositive_v<V>(V::mul(V::sub(V::load(logits + i), V::set(m)), V::set(inv_t))));
    }
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
