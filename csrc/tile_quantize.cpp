// The K-quants' activations, q8_K, with AVX2 (tile_matmul.cpp quantizes
// them so for the products it takes).
//
// On x86 ggml-cpu quantizes q8_K with its portable reference code, element
// by element: about 2.7% of a Gemma 3 prompt's time where the tiles take its
// K-quant products (AVX2), 1.1% with this code. This is the same arithmetic on
// eight floats at a time, so the same bytes: the largest magnitude and the
// first element that has it, the scale -127 / that element, each product
// rounded to an integer by adding 1.5 * 2^23 (the reference's nearest_int,
// its bits taken as they are), at most 127, the low byte kept; sums of 16,
// d = 1 / scale; a block of zeros gets d = 0 and zero bytes, and its sums are
// left as they were. Whether the product is rounded before that addition
// depends on how ggml was compiled (fused where its -march has FMA): both
// are here, and the hook takes the one whose bytes a check against ggml's
// own finds equal, or neither.

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ggml-cpu.h"
#include "tile_matmul_kernels.h"

namespace lmsp::tiles {

#ifdef LMSP_TILES_Q8K

namespace {

constexpr int kQK = 256;

inline float hmax8(__m256 v) {
    __m128 r = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    return _mm_cvtss_f32(_mm_max_ss(r, _mm_movehdup_ps(r)));
}

// The largest magnitude of a block, and the first element with it (the
// reference's strict comparison: a NaN is never taken).
inline float block_max(const float * x, float & amax) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < kQK; j += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), m);
    amax = hmax8(m);
    const __m256 want = _mm256_set1_ps(amax);
    for (int j = 0; j < kQK; j += 8) {
        const auto hit = unsigned(
            _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), want, _CMP_EQ_OQ)));
        if (hit != 0) return x[j + __builtin_ctz(hit)];
    }
    return 0.0f;
}

// Eight values as the reference rounds them: (bits of scale * x + 1.5 * 2^23
// & 0x7fffff) - 0x400000, at most 127, the low byte (in the dword's low 8
// bits). kFused: the product not rounded before the addition, as where ggml
// was compiled with fused multiply-adds (its -march asks for FMA).
template <bool kFused>
inline __m256i rounded(const float * x, __m256 scale) {
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    __m256 v;
    if constexpr (kFused) {
        v = _mm256_fmadd_ps(scale, _mm256_loadu_ps(x), magic);
    } else {
        __m256 product = _mm256_mul_ps(scale, _mm256_loadu_ps(x));
        __asm__("" : "+v"(product));  // rounded here, not fused into the addition
        v = _mm256_add_ps(product, magic);
    }
    const __m256i i = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x007fffff)),
                                       _mm256_set1_epi32(0x00400000));
    return _mm256_and_si256(_mm256_min_epi32(i, _mm256_set1_epi32(127)), _mm256_set1_epi32(0xFF));
}

// 32 values of a block into `qs`, and their two sums of 16 into `sums`.
template <bool kFused>
inline void quantize32(const float * x, __m256 scale, uint8_t * qs, int16_t * sums) {
    const __m256i lo = _mm256_packus_epi32(rounded<kFused>(x, scale), rounded<kFused>(x + 8, scale));
    const __m256i hi = _mm256_packus_epi32(rounded<kFused>(x + 16, scale), rounded<kFused>(x + 24, scale));
    const __m256i q = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(lo, hi),
                                                  _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  // the bytes in order
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(qs), q);
    // sums of 2, of 4 (in 32 bits), then of 16 in lanes 0 and 4
    const __m256i fours = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
    const __m256i sixteens = _mm256_hadd_epi32(_mm256_hadd_epi32(fours, fours), fours);
    sums[0] = int16_t(_mm256_extract_epi32(sixteens, 0));
    sums[1] = int16_t(_mm256_extract_epi32(sixteens, 4));
}

template <bool kFused>
void quantize(const float * x, void * out, int64_t k) {
    auto * y = static_cast<uint8_t *>(out);
    for (int64_t b = 0; b < k / kQK; ++b, x += kQK, y += kQ8KBytes) {
        float amax = 0.0f;
        const float max = block_max(x, amax);
        if (amax == 0.0f) {
            std::memset(y, 0, kQ8KQs + kQK);  // d = 0, the values 0; the sums as they were
            continue;
        }
        const float iscale = -127.0f / max;
        int16_t sums[kQK / 16];
        for (int j = 0; j < kQK; j += 32) {
            quantize32<kFused>(x + j, _mm256_set1_ps(iscale), y + kQ8KQs + j, sums + j / 16);
        }
        std::memcpy(y + kQ8KSums, sums, sizeof(sums));
        const float d = 1.0f / iscale;
        std::memcpy(y, &d, sizeof(d));
    }
}

}  // namespace

QuantizeFn q8_K_quantizer(bool fused) { return fused ? quantize<true> : quantize<false>; }

#else

QuantizeFn q8_K_quantizer(bool) { return nullptr; }

#endif

namespace {

// Rows of `k` floats (a multiple of 256) whose blocks of 256 test the
// quantization's choices in turn: random values of several scales, zeros,
// the largest magnitude twice with either sign first, halves, a NaN among
// them, quarters whose scaled products round to a half.
std::vector<float> q8k_check_rows(int k, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(k));
    for (int b = 0; b < k / 256; ++b) {
        float * v = x.data() + size_t(b) * 256;
        const float scale = std::ldexp(1.0f, int(rng() % 24) - 12);
        for (int j = 0; j < 256; ++j) v[j] = normal(rng) * scale;
        switch (b % 7) {
            case 1: std::fill(v, v + 256, 0.0f); break;
            case 2: v[rng() % 128] = -8.0f * scale, v[128 + rng() % 128] = 8.0f * scale; break;
            case 3: v[rng() % 128] = 8.0f * scale, v[128 + rng() % 128] = -8.0f * scale; break;
            case 4:  // -127 as the largest: the scale is 1, and the halves round to even
                for (int j = 0; j < 256; ++j) v[j] = float(int(rng() % 253) - 126) + 0.5f;
                v[rng() % 256] = -127.0f;
                break;
            case 5: v[rng() % 256] = std::numeric_limits<float>::quiet_NaN(); break;
            case 6:  // quarters: scaled, some round to a half (a fused multiply-add would not)
                for (int j = 0; j < 256; ++j) v[j] = std::round(normal(rng) * 4.0f) / 4.0f;
                break;
            default: break;
        }
    }
    return x;
}

}  // namespace

// Whether `quantize`'s q8_K of such rows is ggml's, byte for byte (the
// bytes it leaves as they were included).
bool q8_K_matches(QuantizeFn quantize, int k, uint32_t seed) {
    if (quantize == nullptr || k <= 0 || k % 256 != 0) return false;
    const std::vector<float> x = q8k_check_rows(k, seed);
    const size_t bytes = ggml_row_size(GGML_TYPE_Q8_K, k);
    std::vector<uint8_t> ours(bytes, 0xA5), ggmls(bytes, 0xA5);
    quantize(x.data(), ours.data(), k);
    ggml_get_type_traits_cpu(GGML_TYPE_Q8_K)->from_float(x.data(), ggmls.data(), k);
    return ours == ggmls;
}

// The q8_K above that gives ggml's bytes, or nullptr.
QuantizeFn checked_q8_K_quantizer() {
    for (const bool fused : {false, true}) {
        const QuantizeFn q = q8_K_quantizer(fused);
        uint32_t seed = 1;
        bool all = q != nullptr;
        for (const int k : {256, 1536, 2048, 6144}) all = all && q8_K_matches(q, k, seed++);
        if (all) return q;
    }
    return nullptr;
}

}  // namespace lmsp::tiles
