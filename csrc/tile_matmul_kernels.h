// The register tiles of tile_matmul.cpp, one file per instruction set:
// tile_matmul_avx512.cpp (q4_1, q5_0, q8_0 with AVX-512 VNNI),
// tile_matmul_avx2.cpp (the same types with AVX2, with or without AVX-VNNI)
// tile_matmul_kquants.cpp (q4_K, q6_K with AVX2),
// tile_matmul_kquants_avx512.cpp (the same types with AVX-512 VNNI: ggml's
// vec_dot for them is the AVX2 one there too) and tile_matmul_f16.cpp (f16,
// with AVX2 or AVX-512); tile_quantize.cpp quantizes the K-quants'
// activations. Each element a tile computes is what ggml's
// vec_dot for that type computes on the instruction set the build targets.
#pragma once

#include <cstdint>
#include <cstring>

#include "ggml.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__AVX512VNNI__)
#define LMSP_TILES_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LMSP_TILES_AVX2 1
#define LMSP_TILES_KQUANTS 1
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LMSP_TILES_F16 1
#endif
#if defined(LMSP_TILES_AVX512) || defined(LMSP_TILES_AVX2)
#define LMSP_TILES_Q8K 1  // tile_quantize.cpp
#endif

#if defined(LMSP_TILES_AVX512) || defined(LMSP_TILES_AVX2) || defined(LMSP_TILES_KQUANTS)
#include <immintrin.h>
#endif

namespace lmsp::tiles {

constexpr int kTile = 4;  // weight rows and activation rows of a tile

// The activation rows of a tile (1 to 4): their quantized rows, for the
// types with fp16 scales (q8_0, q8_1) the scales as floats block by block,
// four rows side by side: d[b * 4 + a] (and q8_1's d * sum in s), and what
// the type's `prepare_act` wrote for them.
struct ActRows {
    const uint8_t * q[kTile];
    const float * d;
    const float * s;
    const float * prepared;
};

// The weight rows of a tile, and what the type's `prepare` wrote for them.
struct WeightRows {
    const uint8_t * w[kTile];
    const float * prepared;
};

// Weight rows w[0..3] by the activation rows, `nb` blocks each:
// out[a * ldo + j] = the product of weight row j and activation row a.
using TileFn = void (*)(const WeightRows & w, const ActRows & y, int nb, float * out, int64_t ldo);
// Run once for a tile's weight rows before their tiles, for all activation
// rows: writes `floats` per block (their scales as floats, say).
using PrepareFn = void (*)(const uint8_t * const * w, int nb, float * out);
// Run once for a group of `n` activation rows (up to four) before their
// tiles, for all weight rows: writes `act_floats` per block.
using PrepareActFn = void (*)(const ActRows & y, int n, int nb, float * out);

// Both buffers are 64-byte aligned.
struct TileKernels {
    TileFn tile[kTile];  // by activation rows: index 0 takes one row, ..., 3 four
    PrepareFn prepare;   // nullptr: none
    int floats;
    PrepareActFn prepare_act = nullptr;
    int act_floats = 0;
    // for a product of one group of activation rows (up to four): tiles that
    // take the weights as they are, without `prepare` (nullptr: `tile` then)
    TileFn one_group[kTile] = {};
};

// A type's kernels, or nullptr where this build has none for it.
const TileKernels * legacy_tiles_avx512(ggml_type type);
const TileKernels * legacy_tiles_avx2(ggml_type type);
const TileKernels * kquant_tiles(ggml_type type);
const TileKernels * kquant_tiles_avx512(ggml_type type);
const TileKernels * f16_tiles(ggml_type type);
// The values an f16 row's length must be a multiple of for its tiles.
int f16_row_multiple();
// ggml's q8_K quantization of `k` floats (a multiple of 256) into `y`, with
// its bytes where ggml's product of the scale and a value is rounded before
// the addition that rounds it to an integer (`fused` false) or not
// (tile_quantize.cpp; nullptr where LMSP_TILES_Q8K is not defined).
using QuantizeFn = void (*)(const float * x, void * y, int64_t k);
QuantizeFn q8_K_quantizer(bool fused);
// Whether `quantize`'s q8_K of `k` check values (a multiple of 256: random
// and edge-case blocks from `seed`) is ggml's own, byte for byte.
bool q8_K_matches(QuantizeFn quantize, int k, uint32_t seed);
// The one of the two whose bytes are ggml's, or nullptr.
QuantizeFn checked_q8_K_quantizer();

#if defined(LMSP_TILES_AVX512) || defined(LMSP_TILES_AVX2) || defined(LMSP_TILES_KQUANTS)
inline int32_t load32(const uint8_t * p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

inline float half(const uint8_t * p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

// 16 bytes of nibbles as 32 values: the low nibbles, then the high ones
// (vec_dot's bytes_from_nibbles_32)
inline __m256i nibbles(const uint8_t * p) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0F));
}

// q8_K, the K-quants' activations: float d, 256 int8, sixteen int16 sums of
// 16 values each
constexpr size_t kQ8KBytes = 292, kQ8KQs = 4, kQ8KSums = 260;

inline float act_d(const uint8_t * block) {
    float d;
    std::memcpy(&d, block, 4);
    return d;
}

// The eight scales and eight minimums of a q4_K superblock as bytes 0-7 and
// 8-15 (vec_dot's unpacking of the 12 bytes).
inline __m128i q4k_scales_and_mins(const uint8_t * scales) {
    constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    uint32_t u[4];
    std::memcpy(u, scales, 12);
    u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
    const uint32_t mins_low = u[1] & kmask1;
    u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
    u[2] = mins_low;
    u[0] &= kmask1;
    return _mm_set_epi32(int(u[3]), int(u[2]), int(u[1]), int(u[0]));
}

// vec_dot's horizontal sum of eight lanes (hsum_float_8 of ggml's x86 code)
inline float hsum8(const float * t) { return ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7])); }

// The same sums in registers, in the same order (the high half plus the low,
// then lanes 2 and 3 onto 0 and 1, then lane 1 onto lane 0)
inline float hsum8(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    return _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)));
}
#endif

}  // namespace lmsp::tiles
