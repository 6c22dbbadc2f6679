// Tiles of q4_1, q5_0 and q8_0 weights with AVX-512 VNNI (tile_matmul.cpp).
//
// Each pair of weight rows shares a 512-bit register. Every element is
// computed exactly as vec_dot computes it where the compiler targets AVX-512
// VNNI: the same eight int32 lanes per block (integer sums, exact in any
// instruction), the same float multiply of the two scales, the same fused
// multiply-add into eight float lanes, block after block, the same
// horizontal sum, and for q4_1 the same fused sum of the blocks' minimum
// times the activations' sums.

#include "tile_matmul_kernels.h"

namespace lmsp::tiles {

#ifdef LMSP_TILES_AVX512

namespace {

// The fp16 halves at byte `at` of four weight blocks as floats: lane 2j (and
// 2j + 1, the next half) of weight row j.
inline __m256 halves(const uint8_t * const * w, size_t at) {
    return _mm256_cvtph_ps(_mm_setr_epi32(load32(w[0] + at), load32(w[1] + at), load32(w[2] + at), load32(w[3] + at)));
}

// Two weight rows' 16 bytes of nibbles (at x0, x1) as 32 values each, side
// by side: vec_dot's bytes_from_nibbles_32 of each.
inline __m512i nibbles(const uint8_t * x0, const uint8_t * x1) {
    const __m256i both = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(x0))),
        _mm_loadu_si128(reinterpret_cast<const __m128i *>(x1)), 1);
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(both), _mm256_srli_epi16(both, 4), 1);
    return _mm512_and_si512(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)), _mm512_set1_epi8(0x0F));
}

// Lanes 0-7 of the result: lane `i` of `v`; lanes 8-15: lane `j`.
inline __m512 pair(__m256 v, int i, int j) {
    const __m512i idx = _mm512_inserti64x4(_mm512_set1_epi32(i), _mm256_set1_epi32(j), 1);
    return _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(v));
}

inline void finish_tile(const __m512 (*acc)[2], int A, const __m128 * summs, float * out, int64_t ldo) {
    for (int a = 0; a < A; ++a) {
        alignas(64) float t[32];
        float s[kTile] = {};
        _mm512_store_ps(t, acc[a][0]);
        _mm512_store_ps(t + 16, acc[a][1]);
        if (summs != nullptr) _mm_storeu_ps(s, summs[a]);
        for (int j = 0; j < kTile; ++j)
            out[a * ldo + j] = summs != nullptr ? hsum8(t + 8 * j) + s[j] : hsum8(t + 8 * j);
    }
}

// q4_1 blocks: fp16 d, fp16 m, 16 bytes of nibbles (20 bytes); q8_1: fp16 d,
// fp16 s, 32 int8.
template <int A>
void tile_q4_1(const WeightRows & rows, const ActRows & y, int nb, float * out, int64_t ldo) {
    const uint8_t * const * w = rows.w;
    __m512 acc[A][2];
    __m128 summs[A];
    for (int a = 0; a < A; ++a) {
        acc[a][0] = acc[a][1] = _mm512_setzero_ps();
        summs[a] = _mm_setzero_ps();
    }
    const __m512i zero = _mm512_setzero_si512();
    for (int b = 0; b < nb; ++b) {
        const size_t at = size_t(b) * 20;
        const __m512i qx[2] = {nibbles(w[0] + at + 4, w[1] + at + 4), nibbles(w[2] + at + 4, w[3] + at + 4)};
        const __m256 dm = halves(w, at);  // d0 m0 d1 m1 d2 m2 d3 m3
        const __m512 dw[2] = {pair(dm, 0, 2), pair(dm, 4, 6)};
        const __m128 m4 = _mm256_castps256_ps128(
            _mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7)));
        for (int a = 0; a < A; ++a) {
            const __m512i qy = _mm512_broadcast_i64x4(
                _mm256_loadu_si256(reinterpret_cast<const __m256i *>(y.q[a] + size_t(b) * 36 + 4)));
            const __m512 dy = _mm512_set1_ps(y.d[b * kTile + a]);
            summs[a] = _mm_fmadd_ps(m4, _mm_set1_ps(y.s[b * kTile + a]), summs[a]);
            for (int p = 0; p < 2; ++p) {
                const __m512 xy = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, qx[p], qy));
                acc[a][p] = _mm512_fmadd_ps(_mm512_mul_ps(dw[p], dy), xy, acc[a][p]);
            }
        }
    }
    finish_tile(acc, A, summs, out, ldo);
}

// Signed weights by q8_0 activations (fp16 d, 32 int8: 34 bytes), as
// vec_dot_q8_0_q8_0 and vec_dot_q5_0_q8_0 compute them: |x| times y with x's
// sign (x = 0 gives 0 either way), the two fp16 scales multiplied as floats.
// `Weights` gives two weight rows' 32 values of a block as int8, side by
// side, and where a block's fp16 d is.
struct Q8_0Weights {
    static constexpr size_t kBytes = 34;  // fp16 d, 32 int8
    static __m512i values(const uint8_t * x0, const uint8_t * x1) {
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(x0 + 2))),
                                  _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x1 + 2)), 1);
    }
};

struct Q5_0Weights {
    static constexpr size_t kBytes = 22;  // fp16 d, 32 high bits, 16 bytes of low nibbles
    // the nibbles, then 0xF0 where a value's high bit is 0 (as vec_dot)
    static __m512i values(const uint8_t * x0, const uint8_t * x1) {
        const uint64_t high = uint64_t(uint32_t(load32(x0 + 2))) | (uint64_t(uint32_t(load32(x1 + 2))) << 32);
        return _mm512_or_si512(nibbles(x0 + 6, x1 + 6), _mm512_maskz_mov_epi8(~high, _mm512_set1_epi8(char(0xF0))));
    }
};

template <class Weights, int A>
void tile_signed(const WeightRows & rows, const ActRows & y, int nb, float * out, int64_t ldo) {
    const uint8_t * const * w = rows.w;
    __m512 acc[A][2];
    for (int a = 0; a < A; ++a) acc[a][0] = acc[a][1] = _mm512_setzero_ps();
    const __m512i zero = _mm512_setzero_si512();
    for (int b = 0; b < nb; ++b) {
        const size_t at = size_t(b) * Weights::kBytes;
        __m512i ax[2];
        __mmask64 neg[2];
        for (int p = 0; p < 2; ++p) {
            const __m512i qx = Weights::values(w[2 * p] + at, w[2 * p + 1] + at);
            ax[p] = _mm512_abs_epi8(qx);
            neg[p] = _mm512_movepi8_mask(qx);
        }
        const __m256 dq = halves(w, at);  // d0 . d1 . d2 . d3 .
        const __m512 dw[2] = {pair(dq, 0, 2), pair(dq, 4, 6)};
        for (int a = 0; a < A; ++a) {
            const __m512i qy = _mm512_broadcast_i64x4(
                _mm256_loadu_si256(reinterpret_cast<const __m256i *>(y.q[a] + size_t(b) * 34 + 2)));
            const __m512 dy = _mm512_set1_ps(y.d[b * kTile + a]);
            for (int p = 0; p < 2; ++p) {
                const __m512i sy = _mm512_mask_sub_epi8(qy, neg[p], zero, qy);
                const __m512 xy = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, ax[p], sy));
                acc[a][p] = _mm512_fmadd_ps(_mm512_mul_ps(dw[p], dy), xy, acc[a][p]);
            }
        }
    }
    finish_tile(acc, A, nullptr, out, ldo);
}

}  // namespace

const TileKernels * legacy_tiles_avx512(ggml_type type) {
    static const TileKernels q4_1 = {{tile_q4_1<1>, tile_q4_1<2>, tile_q4_1<3>, tile_q4_1<4>}, nullptr, 0};
    static const TileKernels q5_0 = {{tile_signed<Q5_0Weights, 1>, tile_signed<Q5_0Weights, 2>,
                                      tile_signed<Q5_0Weights, 3>, tile_signed<Q5_0Weights, 4>},
                                     nullptr,
                                     0};
    static const TileKernels q8_0 = {{tile_signed<Q8_0Weights, 1>, tile_signed<Q8_0Weights, 2>,
                                      tile_signed<Q8_0Weights, 3>, tile_signed<Q8_0Weights, 4>},
                                     nullptr,
                                     0};
    switch (type) {
        case GGML_TYPE_Q4_1: return &q4_1;
        case GGML_TYPE_Q5_0: return &q5_0;
        case GGML_TYPE_Q8_0: return &q8_0;
        default: return nullptr;
    }
}

#else

const TileKernels * legacy_tiles_avx512(ggml_type) { return nullptr; }

#endif  // LMSP_TILES_AVX512

}  // namespace lmsp::tiles
