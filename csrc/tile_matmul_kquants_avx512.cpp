// Tiles of the K-quants q4_K and q6_K with AVX-512 VNNI (tile_matmul.cpp).
//
// ggml's x86 vec_dot for these types is its AVX2 code on AVX-512 machines
// too, and every element here is what that code computes: per superblock
// eight int32 lanes, lane k the sum over the 32-value sub-blocks of the
// sub-block's scale times its four products at bytes 4k to 4k + 3
// (integers, exact however they are formed), the same float products of
// the scales, the same fused multiply-adds into eight lanes (and for q4_K
// four lanes of minimums), superblock after superblock, the same
// horizontal sums.
//
// A 512-bit register holds a pair of weight rows, one row's eight lanes in
// each half, and the activations' 32 bytes of a sub-block go into both
// halves with one broadcast load. dpbusd makes each lane's sum of four
// products in one instruction (it fits in 16 bits), and vpdpwssd multiplies
// it by the sub-block's scale (a lane's low 16 bits, the high ones zero) and
// adds it to the lane: two instructions for two rows where vec_dot takes
// three for one. The weights are unpacked once per weight tile for all
// activation rows (prepare), or superblock by superblock inside the tile
// for a product of one group of activation rows (a decode step).

#include "tile_matmul_kernels.h"

namespace lmsp::tiles {

#ifdef LMSP_TILES_AVX512

namespace {

constexpr int kSubBlocks = 8;  // of 32 values in a superblock

inline __m256i load256(const uint8_t * p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)); }
inline __m128i load128(const uint8_t * p) { return _mm_loadu_si128(reinterpret_cast<const __m128i *>(p)); }

// Two rows' 32 bytes at the same offset, row 0's in the low half.
inline __m512i both(const uint8_t * x0, const uint8_t * x1, size_t at) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(load256(x0 + at)), load256(x1 + at), 1);
}

// Two rows' floats, each over a half (8 lanes), or over a quarter (4 lanes).
inline __m512 halves(float f0, float f1) { return _mm512_insertf32x8(_mm512_set1_ps(f0), _mm256_set1_ps(f1), 1); }
inline __m256 quarters(float f0, float f1) { return _mm256_set_m128(_mm_set1_ps(f1), _mm_set1_ps(f0)); }

// A superblock of a pair of weight rows as the tiles take it.
struct Pair {
    __m512i values[kSubBlocks];  // sub-block m's 32 values of each row
    __m512i scales[kSubBlocks];  // sub-block m's scale of each lane, in its low 16 bits
    // q4_K: the eight minimums of each row as int16 (row r's at words
    // 8r..8r + 7); q6_K: -32 times the sixteen scales of each row as int16
    // (row r's at words 16r..16r + 15)
    __m512i extra;
    __m512 d;     // each row's d over its half
    __m512 dmin;  // q4_K: each row's dmin over a quarter (row r's at lanes 4r..4r + 3)
};
constexpr int kPairFloats = int(sizeof(Pair) / sizeof(float));

// q4_K: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and minimums, 128 bytes
// of nibbles (144 bytes)
struct Q4K {
    static constexpr size_t kBytes = 144;
    static constexpr bool kMins = true;

    static void unpack(const uint8_t * x0, const uint8_t * x1, Pair & u) {
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        for (int j = 0; j < kSubBlocks / 2; ++j) {
            const __m512i q = both(x0, x1, 16 + 32 * size_t(j));
            u.values[2 * j] = _mm512_and_si512(q, m4);
            u.values[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        }
        const __m128i sm0 = q4k_scales_and_mins(x0 + 4), sm1 = q4k_scales_and_mins(x1 + 4);
        // dword lanes 0-7: row 0's scales, 8-15: row 1's
        const __m512i scales = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(sm0, sm1));
        for (int m = 0; m < kSubBlocks; ++m) {
            const __m512i pick = _mm512_inserti64x4(_mm512_set1_epi32(m), _mm256_set1_epi32(8 + m), 1);
            u.scales[m] = _mm512_permutexvar_epi32(pick, scales);
        }
        u.extra = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(_mm_unpackhi_epi64(sm0, sm1)));
        u.d = halves(half(x0), half(x1));
        u.dmin = _mm512_zextps256_ps512(quarters(half(x0 + 2), half(x1 + 2)));
    }
};

// q6_K: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8
// scales, fp16 d (210 bytes); values 0-63, less 32 through the sums
struct Q6K {
    static constexpr size_t kBytes = 210, kHigh = 128, kScales = 192, kD = 208;
    static constexpr bool kMins = false;

    static void unpack(const uint8_t * x0, const uint8_t * x1, Pair & u) {
        const __m512i m3 = _mm512_set1_epi8(3), m15 = _mm512_set1_epi8(15);
        for (int j = 0; j < 2; ++j) {
            const __m512i ql1 = both(x0, x1, 64 * size_t(j)), ql2 = both(x0, x1, 64 * size_t(j) + 32);
            const __m512i qh = both(x0, x1, kHigh + 32 * size_t(j));
            __m512i * v = u.values + 4 * j;
            v[0] = _mm512_or_si512(_mm512_and_si512(ql1, m15), _mm512_slli_epi16(_mm512_and_si512(qh, m3), 4));
            v[1] = _mm512_or_si512(_mm512_and_si512(ql2, m15),
                                   _mm512_slli_epi16(_mm512_and_si512(qh, _mm512_set1_epi8(12)), 2));
            v[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql1, 4), m15),
                                   _mm512_and_si512(qh, _mm512_set1_epi8(48)));
            v[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql2, 4), m15),
                                   _mm512_srli_epi16(_mm512_and_si512(qh, _mm512_set1_epi8(char(0xC0))), 2));
        }
        const __m128i s0 = load128(x0 + kScales), s1 = load128(x1 + kScales);
        // each row's sixteen scales as dwords, their low 16 bits (the sign within them)
        const __m512i low = _mm512_set1_epi32(0xFFFF);
        const __m512i t0 = _mm512_and_si512(_mm512_cvtepi8_epi32(s0), low);
        const __m512i t1 = _mm512_and_si512(_mm512_cvtepi8_epi32(s1), low);
        for (int m = 0; m < kSubBlocks; ++m) {
            // a sub-block of 32 values takes scale 2m in lanes 0-3 of a row and 2m + 1 in lanes 4-7
            const __m256i row = _mm256_set_m128i(_mm_set1_epi32(2 * m + 1), _mm_set1_epi32(2 * m));
            const __m512i pick = _mm512_inserti64x4(_mm512_castsi256_si512(row),
                                                    _mm256_add_epi32(row, _mm256_set1_epi32(16)), 1);
            u.scales[m] = _mm512_permutex2var_epi32(t0, pick, t1);
        }
        const __m512i s16 = _mm512_cvtepi8_epi16(_mm256_set_m128i(s1, s0));
        u.extra = _mm512_sub_epi16(_mm512_setzero_si512(), _mm512_slli_epi16(s16, 5));
        u.d = halves(half(x0 + kD), half(x1 + kD));
        u.dmin = _mm512_setzero_ps();
    }
};

inline const Pair * pairs(const float * prepared, int i) {
    return reinterpret_cast<const Pair *>(prepared) + 2 * size_t(i);
}

template <class K>
void prepare(const uint8_t * const * w, int nb, float * out) {
    Pair * u = reinterpret_cast<Pair *>(out);
    for (int i = 0; i < nb; ++i) {
        const size_t at = size_t(i) * K::kBytes;
        for (int p = 0; p < 2; ++p) K::unpack(w[2 * p] + at, w[2 * p + 1] + at, u[2 * i + p]);
    }
}

// The int32 lanes of a superblock's products of both pairs with A activation
// rows (their q8_K blocks). The empty asm statements keep the sums one after
// the other, each activation sub-block read once for both pairs.
template <class K, int A>
inline void superblock_sums(const Pair * u, const uint8_t * const * block, __m512i (*sumi)[2]) {
    for (int a = 0; a < A; ++a) {
        // q6_K's -32: the sums start at -32 times the scales by the sums of 16 values
        const __m512i sums = K::kMins ? _mm512_setzero_si512() : _mm512_broadcast_i64x4(load256(block[a] + kQ8KSums));
        for (int p = 0; p < 2; ++p) {
            sumi[a][p] = K::kMins ? sums : _mm512_dpwssd_epi32(_mm512_setzero_si512(), sums, u[p].extra);
        }
    }
    for (int m = 0; m < kSubBlocks; ++m) {
        for (int a = 0; a < A; ++a) {
            __m512i qy = _mm512_broadcast_i64x4(load256(block[a] + kQ8KQs + 32 * size_t(m)));
            __asm__("" : "+v"(qy));
            for (int p = 0; p < 2; ++p) {
                const __m512i four = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[p].values[m], qy);
                sumi[a][p] = _mm512_dpwssd_epi32(sumi[a][p], four, u[p].scales[m]);
                __asm__("" : "+v"(sumi[a][p]));
            }
        }
    }
}

// vec_dot's sums for a pair's two rows: the eight lanes of each half, and
// for q4_K the four lanes of each row's minimums.
template <class K>
inline void finish_pair(__m512 acc, __m256 acc_m, float * out, int64_t col) {
    out[col] = hsum8(_mm512_castps512_ps256(acc));
    out[col + 1] = hsum8(_mm512_extractf32x8_ps(acc, 1));
    if constexpr (K::kMins) {
        alignas(32) float m[8];
        _mm256_store_ps(m, acc_m);
        out[col] += (m[0] + m[2]) + (m[1] + m[3]);
        out[col + 1] += (m[4] + m[6]) + (m[5] + m[7]);
    }
}

// Four weight rows by A activation rows: with the weights from what prepare
// wrote (kPrepared), or unpacked superblock by superblock here.
template <class K, int A, bool kPrepared>
void tile(const WeightRows & w, const ActRows & y, int nb, float * out, int64_t ldo) {
    __m512 acc[A][2];
    __m256 acc_m[A][2];
    for (int a = 0; a < A; ++a) {
        for (int p = 0; p < 2; ++p) {
            acc[a][p] = _mm512_setzero_ps();
            acc_m[a][p] = _mm256_setzero_ps();
        }
    }
    alignas(64) Pair unpacked[2];
    for (int i = 0; i < nb; ++i) {
        const Pair * u = unpacked;
        if constexpr (kPrepared) {
            u = pairs(w.prepared, i);
        } else {
            const size_t at = size_t(i) * K::kBytes;
            for (int p = 0; p < 2; ++p) K::unpack(w.w[2 * p] + at, w.w[2 * p + 1] + at, unpacked[p]);
        }
        const uint8_t * block[A];
        for (int a = 0; a < A; ++a) block[a] = y.q[a] + size_t(i) * kQ8KBytes;
        __m512i sumi[A][2];
        superblock_sums<K, A>(u, block, sumi);
        for (int a = 0; a < A; ++a) {
            const float yd = act_d(block[a]);
            for (int p = 0; p < 2; ++p) {
                const __m512 d = _mm512_mul_ps(_mm512_set1_ps(yd), u[p].d);
                acc[a][p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi[a][p]), acc[a][p]);
            }
            if constexpr (K::kMins) {
                // vec_dot's sums of pairs of 16-value sums, for both rows of a pair
                const __m256i sums = load256(block[a] + kQ8KSums);
                const __m128i q8s = _mm_hadd_epi16(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
                const __m256i q8s2 = _mm256_set_m128i(q8s, q8s);
                for (int p = 0; p < 2; ++p) {
                    const __m256i prod = _mm256_madd_epi16(_mm512_castsi512_si256(u[p].extra), q8s2);
                    const __m256 dmin = _mm256_mul_ps(_mm256_set1_ps(-yd), _mm512_castps512_ps256(u[p].dmin));
                    acc_m[a][p] = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(prod), acc_m[a][p]);
                }
            }
        }
    }
    for (int a = 0; a < A; ++a) {
        for (int p = 0; p < 2; ++p) finish_pair<K>(acc[a][p], acc_m[a][p], out + a * ldo, 2 * p);
    }
}

template <class K>
const TileKernels * kernels() {
    static const TileKernels k = {{tile<K, 1, true>, tile<K, 2, true>, tile<K, 3, true>, tile<K, 4, true>},
                                  prepare<K>,
                                  2 * kPairFloats,
                                  nullptr,
                                  0,
                                  {tile<K, 1, false>, tile<K, 2, false>, tile<K, 3, false>, tile<K, 4, false>}};
    return &k;
}

}  // namespace

const TileKernels * kquant_tiles_avx512(ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q4_K: return kernels<Q4K>();
        case GGML_TYPE_Q6_K: return kernels<Q6K>();
        default: return nullptr;
    }
}

#else

const TileKernels * kquant_tiles_avx512(ggml_type) { return nullptr; }

#endif  // LMSP_TILES_AVX512

}  // namespace lmsp::tiles
