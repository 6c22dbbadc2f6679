// Tiles of f16 weights (tile_matmul.cpp): the matrices of an f16 model, the
// sentence-embedding models of the catalog among them.
//
// ggml's x86 vec_dot of two f16 rows (ggml_vec_dot_f16) converts eight
// values (sixteen with AVX-512) of each row to floats, multiplies and adds
// them into one of four float accumulators with a fused multiply-add,
// chunk after chunk (chunk c into accumulator c mod 4), then adds the
// accumulators as (s0 + s2) + (s1 + s3) and sums the lanes. Every product
// of a weight row and an activation row costs two conversions per
// multiply-add there. Here a pass takes one accumulator's chunks for a tile
// of four weight rows by up to four activation rows: each chunk of a row is
// converted once for all the rows of the other side, and every element's
// four accumulators hold what vec_dot's would. The same sums follow. Rows
// are a multiple of one step (four chunks) long; vec_dot's scalar tail is
// never needed.

#include "tile_matmul_kernels.h"

namespace lmsp::tiles {

#ifdef LMSP_TILES_F16

namespace {

constexpr int kAccs = 4;  // ggml's GGML_F16_ARR: the accumulators of vec_dot

#if defined(__AVX512F__)
// GGML_F32Cx16 (and AVX512-FP16's GGML_F16_DOT, the same): sixteen lanes
struct Vec {
    using T = __m512;
    static constexpr int kLanes = 16;
    static constexpr int kActRows = 4;  // activation rows a pass holds: 16 accumulators of 32 registers
    static T zero() { return _mm512_setzero_ps(); }
    static T load(const uint8_t * p) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
    }
    static T fma(T x, T y, T acc) { return _mm512_fmadd_ps(x, y, acc); }
    static float sum(const T * s) {
        return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[2]), _mm512_add_ps(s[1], s[3])));
    }
};
#else
// GGML_F32Cx8: eight lanes
struct Vec {
    using T = __m256;
    static constexpr int kLanes = 8;
    static constexpr int kActRows = 2;  // 8 accumulators, 2 activation chunks and a weight chunk of 16 registers
    static T zero() { return _mm256_setzero_ps(); }
    static T load(const uint8_t * p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))); }
    static T fma(T x, T y, T acc) { return _mm256_fmadd_ps(x, y, acc); }
    static float sum(const T * s) {
        const __m256 a = _mm256_add_ps(_mm256_add_ps(s[0], s[2]), _mm256_add_ps(s[1], s[3]));
        const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        const __m128 t1 = _mm_hadd_ps(t0, t0);
        return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
    }
};
#endif

constexpr int kStep = Vec::kLanes * kAccs;  // values per step of vec_dot
constexpr size_t kBytes = sizeof(uint16_t);

// Four weight rows by A activation rows y[0..A), k values each: the four
// accumulators of every element, one accumulator's chunks per pass.
template <int A>
void rows(const uint8_t * const * w, const uint8_t * const * y, int k, float * out, int64_t ldo) {
    Vec::T sums[kTile][A][kAccs];
    for (int j = 0; j < kAccs; ++j) {
        Vec::T acc[kTile][A];
        for (auto & row : acc) {
            for (Vec::T & v : row) v = Vec::zero();
        }
        for (int i = j * Vec::kLanes; i < k; i += kStep) {
            Vec::T ya[A];
            for (int a = 0; a < A; ++a) ya[a] = Vec::load(y[a] + size_t(i) * kBytes);
            for (int r = 0; r < kTile; ++r) {
                const Vec::T x = Vec::load(w[r] + size_t(i) * kBytes);
                for (int a = 0; a < A; ++a) acc[r][a] = Vec::fma(x, ya[a], acc[r][a]);
            }
        }
        for (int r = 0; r < kTile; ++r) {
            for (int a = 0; a < A; ++a) sums[r][a][j] = acc[r][a];
        }
    }
    for (int r = 0; r < kTile; ++r) {
        for (int a = 0; a < A; ++a) out[a * ldo + r] = Vec::sum(sums[r][a]);
    }
}

// `nb` is the row's length in values (f16's block is one value).
template <int N>
void tile(const WeightRows & w, const ActRows & y, int nb, float * out, int64_t ldo) {
    constexpr int kFirst = N < Vec::kActRows ? N : Vec::kActRows;
    rows<kFirst>(w.w, y.q, nb, out, ldo);
    if constexpr (N > kFirst) rows<N - kFirst>(w.w, y.q + kFirst, nb, out + kFirst * ldo, ldo);
}

const TileKernels kF16 = {{tile<1>, tile<2>, tile<3>, tile<4>}, nullptr, 0};

}  // namespace

const TileKernels * f16_tiles(ggml_type type) { return type == GGML_TYPE_F16 ? &kF16 : nullptr; }

int f16_row_multiple() { return kStep; }

#else

const TileKernels * f16_tiles(ggml_type) { return nullptr; }

int f16_row_multiple() { return 1; }

#endif  // LMSP_TILES_F16

}  // namespace lmsp::tiles
