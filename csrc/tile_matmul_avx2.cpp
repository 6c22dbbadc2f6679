// Tiles of q4_1, q5_0 and q8_0 weights with AVX2 (tile_matmul.cpp), with or
// without AVX-VNNI: where the compiler targets AVX2 but not AVX-512 VNNI.
//
// A pass takes two weight rows by up to four activation rows: eight float
// accumulators of eight lanes, as many as sixteen registers leave room for.
// Every element is computed as ggml's AVX2 vec_dot computes it: the same
// eight int32 lanes per block (integer sums of four products, exact however
// they are formed: maddubs and madd, or AVX-VNNI's dpbusd where the compiler
// targets it), the float product of the two fp16 scales, the same fused
// multiply-add into eight float lanes, block after block, the same
// horizontal sum, and for q4_1 the same fused sum of the blocks' minimum
// times the activations' sums. The weights' scales are made floats once for
// all activation rows (prepare), q4_1's and q5_0's values are unpacked there
// once too, and the products of the scales for the eight pairs of a block
// take one multiply.
//
// q5_0's values (-16 to 15) are kept plus 16 (0 to 31, unsigned), so that a
// block of a pair takes no sign instruction: its sum starts at -16 times the
// activations' sum of each lane, made once per group of activation rows for
// all weight tiles (prepare_act). The same integers: no int16 pair of
// products comes near saturation (2 * 31 * 127).

#include "tile_matmul_kernels.h"

namespace lmsp::tiles {

#ifdef LMSP_TILES_AVX2

namespace {

// A block's products of unsigned by signed bytes, four summed in each of
// eight int32 lanes, added to `start`
inline __m256i dot_us8_from(__m256i start, __m256i ux, __m256i y) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(start, ux, y);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(start, ux, y);
#else
    return _mm256_add_epi32(start, _mm256_madd_epi16(_mm256_set1_epi16(1), _mm256_maddubs_epi16(ux, y)));
#endif
}

// vec_dot's mul_sum_us8_pairs_float: those lanes from zero, as floats
inline __m256 dot_us8(__m256i ax, __m256i sy) {
    return _mm256_cvtepi32_ps(dot_us8_from(_mm256_setzero_si256(), ax, sy));
}

// A block's 32 signed weights, and their absolute values for vec_dot's
// mul_sum_i8_pairs_float (|x| times y with x's sign)
struct Signed {
    __m256i x, ax;
};

inline Signed signed_values(__m256i x) { return {x, _mm256_sign_epi8(x, x)}; }

// A block's values as registers kept in memory (prepare) and read back.
inline __m256i * put(__m256i * v, __m256i x) {
    _mm256_storeu_si256(v, x);
    return v + 1;
}

inline __m256i * put(__m256i * v, const Signed & x) { return put(put(v, x.x), x.ax); }

inline void get(const __m256i * v, __m256i & x) { x = _mm256_loadu_si256(v); }

inline void get(const __m256i * v, Signed & x) { x = {_mm256_loadu_si256(v), _mm256_loadu_si256(v + 1)}; }

// vec_dot's mul_sum_i8_pairs_float of a block's weights and activations
inline __m256 dot_i8(const Signed & w, __m256i y) {
#if defined(__AVXVNNIINT8__)
    return _mm256_cvtepi32_ps(_mm256_dpbssd_epi32(_mm256_setzero_si256(), w.x, y));
#else
    return dot_us8(w.ax, _mm256_sign_epi8(y, w.x));
#endif
}

// The weight types. kBytes: a block; kActBytes and kActQs: a block of the
// activations (q8_1 or q8_0) and where its 32 int8 start; kMin: q4_1's m;
// kOffset: the values are kept plus this (the sums start at minus it times
// the activations' sums).
struct Q4_1 {
    static constexpr size_t kBytes = 20;  // fp16 d, fp16 m, 16 bytes of nibbles
    static constexpr size_t kActBytes = 36, kActQs = 4;
    static constexpr bool kMin = true;
    static constexpr int kOffset = 0;
    static constexpr bool kPredecode = true;
    using Values = __m256i;
    static constexpr size_t kRegs = 1;  // registers a block's values take
    static Values values(const uint8_t * x) { return nibbles(x + 4); }
    static __m256 dot(const Values & x, __m256i y, __m256i) { return dot_us8(x, y); }
};

struct Q8_0 {
    static constexpr size_t kBytes = 34;  // fp16 d, 32 int8
    static constexpr size_t kActBytes = 34, kActQs = 2;
    static constexpr bool kMin = false;
    static constexpr int kOffset = 0;
    static constexpr bool kPredecode = false;
    using Values = Signed;
    static constexpr size_t kRegs = 2;
    static Values values(const uint8_t * x) {
        return signed_values(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(x + 2)));
    }
    static __m256 dot(const Values & x, __m256i y, __m256i) { return dot_i8(x, y); }
};

struct Q5_0 {
    static constexpr size_t kBytes = 22;  // fp16 d, 32 high bits, 16 bytes of low nibbles
    static constexpr size_t kActBytes = 34, kActQs = 2;
    static constexpr bool kMin = false;
    static constexpr int kOffset = 16;
    static constexpr bool kPredecode = true;  // nine instructions a block
    using Values = __m256i;
    static constexpr size_t kRegs = 1;
    // the nibbles, with 0x10 where a value's high bit is 1: vec_dot's value
    // (the nibbles, 0xF0 where it is 0) plus 16
    static Values values(const uint8_t * x) {
        const __m256i spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(load32(x + 2)),
            _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
        const __m256i bit = _mm256_and_si256(spread, _mm256_set1_epi64x(int64_t(0x8040201008040201)));
        const __m256i high = _mm256_andnot_si256(_mm256_cmpeq_epi8(bit, _mm256_setzero_si256()),
                                                 _mm256_set1_epi8(0x10));
        return _mm256_or_si256(nibbles(x + 6), high);
    }
    static __m256 dot(const Values & x, __m256i y, __m256i start) {
        return _mm256_cvtepi32_ps(dot_us8_from(start, x, y));
    }
};

// Where a type that unpacks its weights once per tile keeps them in what
// prepare writes: after the scales and minimums, row after row, each block's
// values as a pass takes them (q5_0: the values and their absolute values).
constexpr size_t kDecodedAt = 32;  // floats per block before them

inline __m256i * decoded(float * prepared, int nb) {
    return reinterpret_cast<__m256i *>(prepared + size_t(nb) * kDecodedAt);
}

template <class W>
const __m256i * decoded(const float * prepared, int nb, int row) {
    return reinterpret_cast<const __m256i *>(prepared + size_t(nb) * kDecodedAt) + size_t(row) * size_t(nb) * W::kRegs;
}

// Once per weight tile: the rows' fp16 scales (and q4_1's minimums) as
// floats, laid out as a pass reads them: for rows 2p and 2p + 1 and block b,
// eight floats at (p * nb + b) * 8, the first row's scale in lanes 0-3, the
// second's in 4-7; q4_1's minimums the same way after all of them. A type
// whose values take many instructions to unpack (q5_0) has them unpacked
// here once, instead of once for every four activation rows of a prompt.
template <class W>
void prepare(const uint8_t * const * w, int nb, float * out) {
    if constexpr (W::kPredecode) {
        __m256i * v = decoded(out, nb);
        for (int r = 0; r < kTile; ++r) {
            for (int b = 0; b < nb; ++b) v = put(v, W::values(w[r] + size_t(b) * W::kBytes));
        }
    }
    for (int b = 0; b < nb; ++b) {
        const size_t at = size_t(b) * W::kBytes;
        // d0 m0 d1 m1 d2 m2 d3 m3 (for the types without m, what follows d)
        const __m256 dm = _mm256_cvtph_ps(
            _mm_setr_epi32(load32(w[0] + at), load32(w[1] + at), load32(w[2] + at), load32(w[3] + at)));
        for (int p = 0; p < 2; ++p) {
            float * d = out + (size_t(p) * size_t(nb) + size_t(b)) * 8;
            const int r0 = 4 * p, r1 = 4 * p + 2;  // lanes of rows 2p and 2p + 1
            _mm256_storeu_ps(d, _mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(r0, r0, r0, r0, r1, r1, r1, r1)));
            if constexpr (W::kMin) {
                float * m = d + size_t(nb) * 16;
                _mm256_storeu_ps(m, _mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(r0 + 1, r0 + 1, r0 + 1, r0 + 1,
                                                                                   r1 + 1, r1 + 1, r1 + 1, r1 + 1)));
            }
        }
    }
}

// Weight rows x0, x1 (their prepared scales at wd, minimums at wm) by A
// activation rows: acc[r][a], and for q4_1 the sums of minimum times
// activation sum in lane 4r + a of *summs.
template <class W, int A>
void pass(const uint8_t * x0, const uint8_t * x1, const float * wd, const float * wm, const __m256i * const * v,
          const ActRows & y, int nb, __m256 (*acc)[A], __m256 * summs) {
    const uint8_t * q[A];  // where each activation row's int8 begin, held apart from y
    for (int a = 0; a < A; ++a) q[a] = y.q[a] + W::kActQs;
    const float * yd = y.d;
    const float * ys = y.s;
    const auto * starts = reinterpret_cast<const __m256i *>(y.prepared);
    alignas(32) float scales[8];
    for (int b = 0; b < nb; ++b) {
        const size_t at = size_t(b) * W::kBytes;
        // lane 4r + a: weight row r's scale times activation row a's. The
        // empty asm makes the address opaque, so that the compiler reads
        // each lane at a fixed offset from it instead of keeping eight
        // addresses, which spill.
        float * scale = scales;
        __asm__("" : "+r"(scale));
        _mm256_store_ps(scale, _mm256_mul_ps(_mm256_loadu_ps(wd + 8 * b),
                                             _mm256_broadcast_ps(reinterpret_cast<const __m128 *>(yd + 4 * b))));
        if constexpr (W::kMin) {
            *summs = _mm256_fmadd_ps(_mm256_loadu_ps(wm + 8 * b),
                                     _mm256_broadcast_ps(reinterpret_cast<const __m128 *>(ys + 4 * b)), *summs);
        }
        typename W::Values x[2];
        if constexpr (W::kPredecode) {
            for (int r = 0; r < 2; ++r) get(v[r] + W::kRegs * size_t(b), x[r]);
        } else {
            x[0] = W::values(x0 + at);
            x[1] = W::values(x1 + at);
        }
        for (int a = 0; a < A; ++a) {
            __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q[a] + size_t(b) * W::kActBytes));
            __asm__("" : "+x"(qy));  // loaded once into a register, not once for each weight row
            __m256i start = _mm256_setzero_si256();
            if constexpr (W::kOffset != 0) {
                start = _mm256_load_si256(starts + size_t(b) * kTile + size_t(a));
                __asm__("" : "+x"(start));
            }
            for (int r = 0; r < 2; ++r) {
                acc[r][a] = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + 4 * r + a), W::dot(x[r], qy, start), acc[r][a]);
            }
        }
    }
}

template <class W, int A>
void tile(const WeightRows & w, const ActRows & y, int nb, float * out, int64_t ldo) {
    for (int p = 0; p < 2; ++p) {
        __m256 acc[2][A];
        for (int r = 0; r < 2; ++r) {
            for (int a = 0; a < A; ++a) acc[r][a] = _mm256_setzero_ps();
        }
        __m256 summs = _mm256_setzero_ps();
        const float * wd = w.prepared + size_t(p) * size_t(nb) * 8;
        const __m256i * v[2] = {nullptr, nullptr};
        if constexpr (W::kPredecode) {
            v[0] = decoded<W>(w.prepared, nb, 2 * p);
            v[1] = decoded<W>(w.prepared, nb, 2 * p + 1);
        }
        pass<W, A>(w.w[2 * p], w.w[2 * p + 1], wd, wd + size_t(nb) * 16, v, y, nb, acc, &summs);
        alignas(32) float s[8];
        _mm256_store_ps(s, summs);
        for (int r = 0; r < 2; ++r) {
            for (int a = 0; a < A; ++a) {
                out[a * ldo + 2 * p + r] = W::kMin ? hsum8(acc[r][a]) + s[4 * r + a] : hsum8(acc[r][a]);
            }
        }
    }
}

// Once per group of activation rows, for a type kept plus kOffset: where each
// row's block sums start, -kOffset times the activations' sum of each lane
// (block b, row a: eight int32 at (4 * b + a) * 8).
template <class W>
void prepare_act(const ActRows & y, int n, int nb, float * out) {
    auto * start = reinterpret_cast<__m256i *>(out);
    const __m256i offset = _mm256_set1_epi8(char(W::kOffset)), ones = _mm256_set1_epi16(1);
    for (int b = 0; b < nb; ++b) {
        for (int a = 0; a < kTile; ++a) {
            __m256i sum = _mm256_setzero_si256();
            if (a < n) {
                const __m256i qy = _mm256_loadu_si256(
                    reinterpret_cast<const __m256i *>(y.q[a] + W::kActQs + size_t(b) * W::kActBytes));
                sum = _mm256_madd_epi16(ones, _mm256_maddubs_epi16(offset, qy));
            }
            _mm256_store_si256(start++, _mm256_sub_epi32(_mm256_setzero_si256(), sum));
        }
    }
}

template <class W>
const TileKernels * kernels() {
    constexpr size_t values = kTile * W::kRegs * 8;  // floats a block's values take
    constexpr int floats = W::kPredecode ? int(kDecodedAt + values) : W::kMin ? 32 : 16;
    constexpr bool offset = W::kOffset != 0;
    static const TileKernels k = {{tile<W, 1>, tile<W, 2>, tile<W, 3>, tile<W, 4>},
                                  prepare<W>,
                                  floats,
                                  offset ? prepare_act<W> : nullptr,
                                  offset ? kTile * 8 : 0};
    return &k;
}

}  // namespace

const TileKernels * legacy_tiles_avx2(ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q4_1: return kernels<Q4_1>();
        case GGML_TYPE_Q5_0: return kernels<Q5_0>();
        case GGML_TYPE_Q8_0: return kernels<Q8_0>();
        default: return nullptr;
    }
}

#else

const TileKernels * legacy_tiles_avx2(ggml_type) { return nullptr; }

#endif  // LMSP_TILES_AVX2

}  // namespace lmsp::tiles
