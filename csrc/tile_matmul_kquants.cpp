// Tiles of the K-quants q4_K and q6_K (tile_matmul.cpp), for x86 builds with
// AVX2 and without AVX-512 VNNI (those take tile_matmul_kquants_avx512.cpp's).
//
// A weight tile's superblocks (256 values each) are unpacked once for all
// activation rows (prepare: the values as bytes, the sub-block scales as
// madd takes them), and each tile then takes them by up to four activation
// rows (q8_K: a float scale, 256 int8, sixteen int16 sums). Every element is
// computed as vec_dot computes it: the same eight int32 lanes per superblock
// (bytes by bytes in 16-bit pairs, times the sub-block scales in 32-bit
// pairs: integer sums, exact in any order), the same float products of the
// scales, the same fused multiply-adds into eight lanes (and for q4_K four
// lanes of minimums), superblock after superblock, the same horizontal sums.

#include "tile_matmul_kernels.h"

namespace lmsp::tiles {

#ifdef LMSP_TILES_KQUANTS

namespace {

inline __m256i load256(const uint8_t * p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)); }

inline void finish(const __m256 * acc, const __m128 * acc_m, int A, float * out, int64_t ldo) {
    for (int a = 0; a < A; ++a) {
        alignas(16) float m[4] = {};
        if (acc_m != nullptr) _mm_store_ps(m, acc_m[a]);
        const float mins = (m[0] + m[2]) + (m[1] + m[3]);  // vec_dot's sum of acc_m's four lanes
        out[a * ldo] = acc_m != nullptr ? hsum8(acc[a]) + mins : hsum8(acc[a]);
    }
}

// q4_K: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and minimums, 128 bytes
// of nibbles (144 bytes)
constexpr size_t kQ4KBytes = 144;

// q6_K: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8
// scales, fp16 d (210 bytes); values 0-63, less 32 through the sums
constexpr size_t kQ6KBytes = 210, kQ6KHigh = 128, kQ6KScales = 192, kQ6KD = 208;

// What prepare writes for each weight row and superblock, read back by the
// tiles: the eight sub-blocks' 32 values as bytes, each sub-block's scale in
// every 16-bit lane as vec_dot's madd takes it, and what the superblock's
// float step needs (q4_K: its minimums as 16-bit lanes, d and dmin; q6_K:
// its sixteen scales as 16-bit lanes and d).
constexpr int kSubBlocks = 8;
struct Unpacked {
    uint8_t values[kSubBlocks][32];
    uint8_t scales[kSubBlocks][32];
    uint8_t extra[32];  // q4_K: the minimums (low half); q6_K: the scales as int16
    float d, dmin;
    float pad[6];  // a whole number of 32 bytes
};
constexpr int kUnpackedFloats = int(sizeof(Unpacked) / sizeof(float));

inline Unpacked * unpacked(float * prepared, int nb, int row) {
    return reinterpret_cast<Unpacked *>(prepared) + size_t(row) * size_t(nb);
}
inline const Unpacked * unpacked(const float * prepared, int nb, int row) {
    return reinterpret_cast<const Unpacked *>(prepared) + size_t(row) * size_t(nb);
}

inline void store(uint8_t * p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i *>(p), v); }

void unpack_q4_K(const uint8_t * x, Unpacked & u) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i mins_and_scales = _mm256_cvtepu8_epi16(q4k_scales_and_mins(x + 4));
    const __m128i sc = _mm256_castsi256_si128(mins_and_scales);
    const __m256i scales = _mm256_set_m128i(sc, sc);
    for (int j = 0; j < 4; ++j) {
        store(u.scales[2 * j], _mm256_shuffle_epi8(scales, _mm256_set1_epi16(short(0x0100 + 0x0202 * (2 * j)))));
        store(u.scales[2 * j + 1],
              _mm256_shuffle_epi8(scales, _mm256_set1_epi16(short(0x0100 + 0x0202 * (2 * j + 1)))));
        const __m256i q4 = load256(x + 16 + 32 * j);
        store(u.values[2 * j], _mm256_and_si256(q4, m4));
        store(u.values[2 * j + 1], _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4));
    }
    store(u.extra, _mm256_castsi128_si256(_mm256_extracti128_si256(mins_and_scales, 1)));
    u.d = half(x);
    u.dmin = half(x + 2);
}

void unpack_q6_K(const uint8_t * x, Unpacked & u) {
    const __m256i m3 = _mm256_set1_epi8(3), m15 = _mm256_set1_epi8(15);
    const __m128i scales = _mm_loadu_si128(reinterpret_cast<const __m128i *>(x + kQ6KScales));
    for (int j = 0; j < 2; ++j) {
        const __m256i ql1 = load256(x + 64 * j), ql2 = load256(x + 64 * j + 32);
        const __m256i qh = load256(x + kQ6KHigh + 32 * j);
        uint8_t(*v)[32] = u.values + 4 * j;
        store(v[0], _mm256_or_si256(_mm256_and_si256(ql1, m15), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4)));
        store(v[1], _mm256_or_si256(_mm256_and_si256(ql2, m15),
                                    _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(12)), 2)));
        store(v[2], _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m15),
                                    _mm256_and_si256(qh, _mm256_set1_epi8(48))));
        store(v[3], _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql2, 4), m15),
                                    _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(char(0xC0))), 2)));
        for (int k = 0; k < 4; ++k) {
            // scale 2m in the first eight 16-bit lanes, 2m + 1 in the last eight (m = 4j + k)
            const int m = 4 * j + k;
            const __m128i pick = _mm_set_epi64x(int64_t(0x0101010101010101ULL * uint64_t(2 * m + 1)),
                                                int64_t(0x0101010101010101ULL * uint64_t(2 * m)));
            store(u.scales[m], _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, pick)));
        }
    }
    store(u.extra, _mm256_cvtepi8_epi16(scales));
    u.d = half(x + kQ6KD);
    u.dmin = 0.0f;
}

template <void (*Unpack)(const uint8_t *, Unpacked &), size_t Bytes>
void prepare_kquant(const uint8_t * const * w, int nb, float * out) {
    for (int r = 0; r < kTile; ++r) {
        Unpacked * u = unpacked(out, nb, r);
        for (int i = 0; i < nb; ++i) Unpack(w[r] + size_t(i) * Bytes, u[i]);
    }
}

// The int32 lanes of one superblock's products with A activation rows:
// vec_dot's sum over the sub-blocks of scale times (bytes by bytes in 16-bit
// pairs); integer sums, exact in any order. The empty asm statements keep a
// sub-block's values and scales in registers (read once, not once for each
// activation row) and the sums one after the other: the compiler otherwise
// holds all 32 products to add them as a tree, and spills them.
template <int A>
inline void superblock_sums(const Unpacked & u, const uint8_t * const * q8, __m256i * sumi) {
    for (int a = 0; a < A; ++a) sumi[a] = _mm256_setzero_si256();
    for (int m = 0; m < kSubBlocks; ++m) {
        __m256i v = load256(u.values[m]);
        __asm__("" : "+x"(v));
        __m256i s = load256(u.scales[m]);
        __asm__("" : "+x"(s));
        for (int a = 0; a < A; ++a) {
            const __m256i p = _mm256_madd_epi16(s, _mm256_maddubs_epi16(v, load256(q8[a] + 32 * m)));
            sumi[a] = _mm256_add_epi32(sumi[a], p);
            __asm__("" : "+x"(sumi[a]));
        }
    }
}

// Four weight rows by A activation rows, superblock after superblock: each
// activation row's sums of pairs of 16-value sums (for the minimums) are
// made once for the four weight rows.
template <int A>
void tile_q4_K(const WeightRows & w, const ActRows & y, int nb, float * out, int64_t ldo) {
    __m256 acc[kTile][A];
    __m128 acc_m[kTile][A];
    for (int r = 0; r < kTile; ++r) {
        for (int a = 0; a < A; ++a) {
            acc[r][a] = _mm256_setzero_ps();
            acc_m[r][a] = _mm_setzero_ps();
        }
    }
    const Unpacked * u[kTile];
    for (int r = 0; r < kTile; ++r) u[r] = unpacked(w.prepared, nb, r);
    for (int i = 0; i < nb; ++i) {
        const uint8_t * q8[A];
        __m128i q8s[A];
        float yd[A];
        for (int a = 0; a < A; ++a) {
            const uint8_t * block = y.q[a] + size_t(i) * kQ8KBytes;
            q8[a] = block + kQ8KQs;
            const __m256i q8sums = load256(block + kQ8KSums);
            q8s[a] = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256(q8sums, 1));
            yd[a] = act_d(block);
        }
        for (int r = 0; r < kTile; ++r) {
            const Unpacked & ur = u[r][i];
            // read again for each weight row from where they are (opaque
            // addresses), not copied to the stack once for all four
            const uint8_t * rows[A];
            for (int a = 0; a < A; ++a) {
                rows[a] = q8[a];
                __asm__("" : "+r"(rows[a]));
            }
            __m256i sumi[A];
            superblock_sums<A>(ur, rows, sumi);
            const __m128i mins = _mm256_castsi256_si128(load256(ur.extra));
            for (int a = 0; a < A; ++a) {
                const float d = yd[a] * ur.d, dmin = -yd[a] * ur.dmin;
                const __m128i prod = _mm_madd_epi16(mins, q8s[a]);
                acc_m[r][a] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[r][a]);
                acc[r][a] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[a]), acc[r][a]);
            }
        }
    }
    for (int r = 0; r < kTile; ++r) finish(acc[r], acc_m[r], A, out + r, ldo);
}

template <int A>
void row_q6_K(const Unpacked * u, const ActRows & y, int nb, float * out, int64_t ldo) {
    __m256 acc[A];
    for (int a = 0; a < A; ++a) acc[a] = _mm256_setzero_ps();
    for (int i = 0; i < nb; ++i) {
        const uint8_t * q8[A];
        for (int a = 0; a < A; ++a) q8[a] = y.q[a] + size_t(i) * kQ8KBytes + kQ8KQs;
        __m256i sumi[A];
        superblock_sums<A>(u[i], q8, sumi);
        const __m256i scales_16 = load256(u[i].extra);
        for (int a = 0; a < A; ++a) {
            const uint8_t * block = y.q[a] + size_t(i) * kQ8KBytes;
            const float d = act_d(block) * u[i].d;
            // 32 times each scale times its 16 values' sum: the -32 of every value
            const __m256i sub = _mm256_slli_epi32(_mm256_madd_epi16(load256(block + kQ8KSums), scales_16), 5);
            acc[a] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[a], sub)), acc[a]);
        }
    }
    finish(acc, nullptr, A, out, ldo);
}

template <int A>
void tile_q6_K(const WeightRows & w, const ActRows & y, int nb, float * out, int64_t ldo) {
    for (int r = 0; r < kTile; ++r) row_q6_K<A>(unpacked(w.prepared, nb, r), y, nb, out + r, ldo);
}

}  // namespace

const TileKernels * kquant_tiles(ggml_type type) {
    constexpr int floats = kTile * kUnpackedFloats;
    static const TileKernels q4_K = {
        {tile_q4_K<1>, tile_q4_K<2>, tile_q4_K<3>, tile_q4_K<4>}, prepare_kquant<unpack_q4_K, kQ4KBytes>, floats};
    static const TileKernels q6_K = {
        {tile_q6_K<1>, tile_q6_K<2>, tile_q6_K<3>, tile_q6_K<4>}, prepare_kquant<unpack_q6_K, kQ6KBytes>, floats};
    switch (type) {
        case GGML_TYPE_Q4_K: return &q4_K;
        case GGML_TYPE_Q6_K: return &q6_K;
        default: return nullptr;
    }
}

#else

const TileKernels * kquant_tiles(ggml_type) { return nullptr; }

#endif  // LMSP_TILES_KQUANTS

}  // namespace lmsp::tiles
