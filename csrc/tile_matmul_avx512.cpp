// Tiles of q4_1, q5_0 and q8_0 weights with AVX-512 VNNI (tile_matmul.cpp).
//
// Every element is computed exactly as vec_dot computes it where the
// compiler targets AVX-512 VNNI: the same eight int32 lanes per block
// (integer sums of four products, exact however they are formed), the same
// float product of the two scales, the same fused multiply-add into eight
// float lanes, block after block, the same horizontal sum, and for q4_1 the
// same fused sum of the blocks' minimum times the activations' sums.
//
// A 512-bit register holds two weight rows' lanes, a dword at a time: lane
// 2k + r is row r's lane k. So the products of the scales for a pair of rows
// and an activation row are two adjacent floats, which one broadcast load
// spreads over the register. Everything that does not depend on both the
// weights and the activations is made once, outside the tiles: the weights'
// values, side by side, once per weight tile for all activation rows
// (prepare); the activations' bytes, each dword twice, once per group of
// activation rows for all weight tiles (prepare_act). q5_0 and q8_0 weights
// are signed: vec_dot multiplies their absolute values by the activations
// with the weights' signs. Here the activations are made unsigned instead
// (plus 128) and the sum starts at -128 times the weights' sum of each lane,
// made with the weights: the same integers in one instruction.

#include "tile_matmul_kernels.h"

namespace lmsp::tiles {

#ifdef LMSP_TILES_AVX512

namespace {

// What prepare_act writes per block of a group of four activation rows: row
// a's 32 int8 at 16 * a (dword k in lanes 2k and 2k + 1), then the rows'
// scales at kActScalesAt (lane 4a + r: row a's).
constexpr int kActScalesAt = 64;
constexpr int kActFloats = 80;

inline __m512i load512(const float * p) { return _mm512_load_si512(p); }

// The weight types. kBytes: a block; kActBytes, kActQs: a block of the
// activations (q8_1 or q8_0) and where its int8 start; kSigned: signed
// values (made with the sum's start); kMin: q4_1's minimum.
struct Q4_1 {
    static constexpr size_t kBytes = 20;  // fp16 d, fp16 m, 16 bytes of nibbles
    static constexpr size_t kActBytes = 36, kActQs = 4;
    static constexpr bool kSigned = false, kMin = true;
    static __m256i values(const uint8_t * x) { return nibbles(x + 4); }
};

struct Q8_0 {
    static constexpr size_t kBytes = 34;  // fp16 d, 32 int8
    static constexpr size_t kActBytes = 34, kActQs = 2;
    static constexpr bool kSigned = true, kMin = false;
    static __m256i values(const uint8_t * x) { return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x + 2)); }
};

struct Q5_0 {
    static constexpr size_t kBytes = 22;  // fp16 d, 32 high bits, 16 bytes of low nibbles
    static constexpr size_t kActBytes = 34, kActQs = 2;
    static constexpr bool kSigned = true, kMin = false;
    // the nibbles, then 0xF0 where a value's high bit is 0 (as vec_dot)
    static __m256i values(const uint8_t * x) {
        const auto high = __mmask32(uint32_t(load32(x + 2)));
        return _mm256_or_si256(nibbles(x + 6), _mm256_maskz_mov_epi8(_knot_mask32(high), _mm256_set1_epi8(char(0xF0))));
    }
};

// What prepare writes per block of a weight tile (floats from the block's
// start): pair p's values at 16 * p (rows 2p and 2p + 1 a dword at a time),
// the signed types' sum starts at kStartAt + 16 * p, the four rows' scales
// four times over at kScalesAt (lane 4a + r: row r's), q4_1's minimums at
// kMinsAt.
template <class W>
struct Layout {
    static constexpr int kStartAt = 32;
    static constexpr int kScalesAt = W::kSigned ? 64 : 32;
    static constexpr int kMinsAt = kScalesAt + 16;
    static constexpr int kFloats = kScalesAt + 32;  // a multiple of 16: blocks stay 64-byte aligned
};

// A block of a weight tile as the tiles use it.
struct Block {
    __m512i x[2];      // pair p's values, a dword of each row in turn
    __m512i start[2];  // the signed types' sum starts
    __m512 scales;     // the four rows' scales, four times over
    __m128 mins;       // q4_1's minimums
};

template <class W>
inline Block unpack(const uint8_t * const * w, size_t at) {
    const __m512i pairs = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i zero = _mm512_setzero_si512();
    Block k;
    for (int p = 0; p < 2; ++p) {
        k.x[p] = _mm512_permutex2var_epi32(_mm512_castsi256_si512(W::values(w[2 * p] + at)), pairs,
                                           _mm512_castsi256_si512(W::values(w[2 * p + 1] + at)));
        // -128 times each lane's sum of four values
        k.start[p] = W::kSigned
                         ? _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(char(0x80)), k.x[p]))
                         : zero;
    }
    // d0 m0 d1 m1 d2 m2 d3 m3 (for q8_0 and q5_0, what follows d)
    const __m256 dm = _mm256_cvtph_ps(
        _mm_setr_epi32(load32(w[0] + at), load32(w[1] + at), load32(w[2] + at), load32(w[3] + at)));
    k.scales = _mm512_broadcast_f32x4(
        _mm256_castps256_ps128(_mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6))));
    k.mins = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7)));
    return k;
}

template <class W>
void prepare(const uint8_t * const * w, int nb, float * out) {
    using L = Layout<W>;
    for (int b = 0; b < nb; ++b) {
        float * o = out + size_t(b) * L::kFloats;
        const Block k = unpack<W>(w, size_t(b) * W::kBytes);
        for (int p = 0; p < 2; ++p) {
            _mm512_store_si512(o + 16 * p, k.x[p]);
            if constexpr (W::kSigned) _mm512_store_si512(o + L::kStartAt + 16 * p, k.start[p]);
        }
        _mm512_store_ps(o + L::kScalesAt, k.scales);
        if constexpr (W::kMin) _mm_store_ps(o + L::kMinsAt, k.mins);
    }
}

// A group of n activation rows (of up to four), for every weight tile.
template <class W>
void prepare_act(const ActRows & y, int n, int nb, float * out) {
    const __m512i twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i four = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i bias = _mm512_set1_epi8(W::kSigned ? char(0x80) : 0);
    for (int b = 0; b < nb; ++b) {
        float * o = out + size_t(b) * kActFloats;
        for (int a = 0; a < n; ++a) {
            const __m256i q = _mm256_loadu_si256(
                reinterpret_cast<const __m256i *>(y.q[a] + size_t(b) * W::kActBytes + W::kActQs));
            _mm512_store_si512(o + 16 * a,
                               _mm512_xor_si512(_mm512_permutexvar_epi32(twice, _mm512_castsi256_si512(q)), bias));
        }
        _mm512_store_ps(o + kActScalesAt,
                        _mm512_permutexvar_ps(four, _mm512_castps128_ps512(_mm_loadu_ps(y.d + size_t(b) * kTile))));
    }
}

// The two floats at p spread over a register (lanes 2k: p[0], 2k + 1: p[1]).
inline __m512 pair_of(const float * p) {
    double both;
    std::memcpy(&both, p, sizeof(both));
    return _mm512_castpd_ps(_mm512_set1_pd(both));
}

// vec_dot's sum of a row's eight lanes, for both rows of a pair: out[0] and out[1]
inline void finish_pair(__m512 acc, float * out) {
    const __m512i rows = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m512 v = _mm512_permutexvar_ps(rows, acc);
    out[0] = hsum8(_mm512_castps512_ps256(v));
    out[1] = hsum8(_mm512_extractf32x8_ps(v, 1));
}

// Weight rows by A activation rows: with the weights from what prepare
// wrote (kPrepared), or unpacked block by block here (a product of one group
// of activation rows, where unpacking them once more costs less than
// writing them out and reading them back).
template <class W, int A, bool kPrepared>
void tile(const WeightRows & w, const ActRows & y, int nb, float * out, int64_t ldo) {
    using L = Layout<W>;
    __m512 acc[A][2];
    __m128 summs[A];
    for (int a = 0; a < A; ++a) {
        acc[a][0] = acc[a][1] = _mm512_setzero_ps();
        summs[a] = _mm_setzero_ps();
    }
    const float * wp = w.prepared;
    const float * yp = y.prepared;
    alignas(64) float products[16];
    for (int b = 0; b < nb; ++b, yp += kActFloats) {
        Block k;
        if constexpr (kPrepared) {
            for (int p = 0; p < 2; ++p) {
                k.x[p] = load512(wp + 16 * p);
                if constexpr (W::kSigned) k.start[p] = load512(wp + L::kStartAt + 16 * p);
            }
            k.scales = _mm512_load_ps(wp + L::kScalesAt);
            if constexpr (W::kMin) k.mins = _mm_load_ps(wp + L::kMinsAt);
            wp += L::kFloats;
        } else {
            k = unpack<W>(w.w, size_t(b) * W::kBytes);
        }
        // lane 4a + r: weight row r's scale times activation row a's, read
        // back through an opaque address: the compiler cannot forward the
        // stored register, and broadcasts each pair from memory (a load)
        // instead of shuffling it out (an instruction on the vector ports)
        _mm512_store_ps(products, _mm512_mul_ps(k.scales, _mm512_load_ps(yp + kActScalesAt)));
        const float * scale = products;
        __asm__("" : "+r"(scale));
        if constexpr (W::kMin) {
            for (int a = 0; a < A; ++a) summs[a] = _mm_fmadd_ps(k.mins, _mm_set1_ps(y.s[b * kTile + a]), summs[a]);
        }
        for (int a = 0; a < A; ++a) {
            __m512i qy = load512(yp + 16 * a);
            __asm__("" : "+v"(qy));  // loaded once into a register, not once for each pair
            for (int p = 0; p < 2; ++p) {
                const __m512i sum = W::kSigned ? _mm512_dpbusd_epi32(k.start[p], qy, k.x[p])
                                               : _mm512_dpbusd_epi32(_mm512_setzero_si512(), k.x[p], qy);
                acc[a][p] = _mm512_fmadd_ps(pair_of(scale + 4 * a + 2 * p), _mm512_cvtepi32_ps(sum), acc[a][p]);
            }
        }
    }
    for (int a = 0; a < A; ++a) {
        alignas(16) float s[kTile];
        _mm_store_ps(s, summs[a]);
        for (int p = 0; p < 2; ++p) {
            float t[2];
            finish_pair(acc[a][p], t);
            for (int r = 0; r < 2; ++r) out[a * ldo + 2 * p + r] = W::kMin ? t[r] + s[2 * p + r] : t[r];
        }
    }
}

template <class W>
const TileKernels * kernels() {
    static const TileKernels k = {{tile<W, 1, true>, tile<W, 2, true>, tile<W, 3, true>, tile<W, 4, true>},
                                  prepare<W>,
                                  Layout<W>::kFloats,
                                  prepare_act<W>,
                                  kActFloats,
                                  {tile<W, 1, false>, tile<W, 2, false>, tile<W, 3, false>, tile<W, 4, false>}};
    return &k;
}

}  // namespace

const TileKernels * legacy_tiles_avx512(ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q4_1: return kernels<Q4_1>();
        case GGML_TYPE_Q5_0: return kernels<Q5_0>();
        case GGML_TYPE_Q8_0: return kernels<Q8_0>();
        default: return nullptr;
    }
}

#else

const TileKernels * legacy_tiles_avx512(ggml_type) { return nullptr; }

#endif  // LMSP_TILES_AVX512

}  // namespace lmsp::tiles
