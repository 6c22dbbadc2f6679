// Tiled products on ARM (NEON with the dot-product extension) that give
// ggml-cpu's one-row bits.
//
// ggml's aarch64 vec_dot for q4_1, q5_0 and q8_0 (arch/arm/quants.c, the
// NEON branch, one row: nrc = 1) works on pairs of blocks. For each block it
// takes four int32 lanes, lane i the sum of the products of values 4i..4i+3
// and 16+4i..16+4i+3 (sdot), converts them to float and adds them times the
// product of the two fp16 scales (vmlaq_n_f32) into one of two accumulators:
// the even blocks' and the odd blocks'. The sum is the horizontal sum of the
// even accumulator plus that of the odd one (plus, for q4_1, the running sum
// of each pair's two minimum-times-sum products), and a last odd block is
// added in scalar code. Here a tile of four weight rows by up to four
// activation rows does the same for each element: the even blocks in one
// pass, the odd ones in a second, so that 16 accumulators hold a 4 x 4 tile;
// each weight block is unpacked once for four activation rows. The integer
// lanes are exact whatever the instruction order. The float operations are
// those GCC (12, aarch64) makes of ggml's code: vmlaq_n_f32 a multiply, then
// an add; the pair's minimum terms m0 * s0 + m1 * s1 as fma(m0, s0, m1 * s1);
// the last odd block's term fused with its sum (q5_0, q8_0) or with m * s
// (q4_1). This file is compiled without contraction (-ffp-contract=off) and
// writes each fused multiply-add out, so that it computes exactly these. A
// ggml compiled otherwise (another compiler, another tuning) may fuse
// elsewhere: the install check of tile_matmul.cpp compares every type with
// ggml's vec_dot bit for bit and takes it only where all match.
//
// With i8mm, ggml's own product of two rows and two columns at a time
// (nrc = 2, vmmlaq_s32; q4_1, q8_0 and the K-quants) sums in another order
// than one row: ggml's own path gives a row other bits in an even batch than
// alone. The tiles give every row the one-row bits, with or without i8mm:
// vec_dot of one row is the same NEON code. One difference was found in a
// ggml built with +i8mm by GCC 12.2 (Debian 12): its q5_0 vec_dot gets a
// last odd block wrong (the scalar tail, vectorized with usdot, is not the
// exact sum the tiles give). The install check includes an odd block count,
// so such a build leaves q5_0 to ggml. A ggml built with SVE (Graviton 3, say)
// computes q8_0 with its SVE code, fused and summed in another order: the
// install check leaves q8_0 to ggml there too (seen under qemu with vectors
// of 128, 256 and 512 bits; q4_1, q4_K and q6_K keep the NEON bits).
//
// q4_K and q6_K (super-blocks of 256 values) are further down.
//
// The tests build this for aarch64 with Debian's cross compiler and compare
// it with ggml's NEON vec_dot under qemu (tests/native/arm/). No speed is
// claimed for ARM until it is measured on ARM.

#include "tile_matmul_neon.h"

#if defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)

#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace lmsp::neon {

namespace {

constexpr int kTile = 4;  // weight rows and activation rows of a tile

// ggml's GGML_CPU_FP16_TO_FP32 on aarch64
inline float half(const uint8_t * p) {
    __fp16 h;
    std::memcpy(&h, p, 2);
    return float(h);
}

inline uint32_t load32(const uint8_t * p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

inline int8x16_t load_s8(const uint8_t * p) { return vld1q_s8(reinterpret_cast<const int8_t *>(p)); }

// The activation rows of a tile: their quantized blocks, and per block
// their scale (and for q8_1 the fp16 sum) as floats.
struct ActRows {
    const uint8_t * q[kTile];
    const float * d[kTile];
    const float * s[kTile];
};

// A weight type: its block's bytes, the activation block's (q8_0: fp16 d and
// 32 int8; q8_1: fp16 d, fp16 s and 32 int8), and its 32 values as int8,
// values 0-15 in `lo` and 16-31 in `hi`.
struct Q8_0 {
    static constexpr size_t kBytes = 34, kActBytes = 34, kActQs = 2;
    static void values(const uint8_t * x, int8x16_t & lo, int8x16_t & hi) {
        lo = load_s8(x + 2);
        hi = load_s8(x + 18);
    }
    static float tail(float sumf, int sumi, float dx, float dy, float, float) {
        return std::fma(dx * dy, float(sumi), sumf);
    }
};

struct Q4_1 {
    static constexpr size_t kBytes = 20, kActBytes = 36, kActQs = 4;  // fp16 d, fp16 m, 16 bytes of nibbles
    static void values(const uint8_t * x, int8x16_t & lo, int8x16_t & hi) {
        const uint8x16_t v = vld1q_u8(x + 4);
        lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
        hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
    }
    static float tail(float sumf, int sumi, float dx, float dy, float mx, float sy) {
        return sumf + std::fma(dx * dy, float(sumi), mx * sy);
    }
};

struct Q5_0 {
    static constexpr size_t kBytes = 22, kActBytes = 34, kActQs = 2;  // fp16 d, 32 high bits, 16 bytes of nibbles
    // (nibble | high bit << 4) - 16
    static void values(const uint8_t * x, int8x16_t & lo, int8x16_t & hi) {
        static const uint8_t kLoBytes[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
        static const uint8_t kHiBytes[16] = {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
        static const uint8_t kBits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
        const uint8x16_t qh = vreinterpretq_u8_u32(vdupq_n_u32(load32(x + 2)));
        const uint8x16_t bits = vld1q_u8(kBits), five = vdupq_n_u8(0x10);
        const uint8x16_t h_lo = vandq_u8(vtstq_u8(vqtbl1q_u8(qh, vld1q_u8(kLoBytes)), bits), five);
        const uint8x16_t h_hi = vandq_u8(vtstq_u8(vqtbl1q_u8(qh, vld1q_u8(kHiBytes)), bits), five);
        const uint8x16_t v = vld1q_u8(x + 6);
        lo = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(v, vdupq_n_u8(0x0F)), h_lo)), vdupq_n_s8(16));
        hi = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(v, 4), h_hi)), vdupq_n_s8(16));
    }
    static float tail(float sumf, int sumi, float dx, float dy, float, float) {
        return std::fma(dx * dy, float(sumi), sumf);
    }
};

// vec_dot's four int32 lanes of one block
inline int32x4_t lanes(int8x16_t lo, int8x16_t hi, int8x16_t yl, int8x16_t yh) {
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, yl), hi, yh);
}

// The blocks b = parity, parity + 2, ... below the last pair's end: sum[a][j]
// gets (parity 0) or adds (parity 1) the horizontal sum of their accumulator.
template <class W, int A>
void pass(const uint8_t * const * w, const ActRows & y, int pairs, int parity, float (*sum)[kTile]) {
    float32x4_t acc[A][kTile];
    for (int a = 0; a < A; ++a) {
        for (int j = 0; j < kTile; ++j) acc[a][j] = vdupq_n_f32(0.0f);
    }
    for (int i = 0; i < pairs; ++i) {
        const int b = 2 * i + parity;
        const size_t at = size_t(b) * W::kBytes;
        int8x16_t lo[kTile], hi[kTile];
        float dx[kTile];
        for (int j = 0; j < kTile; ++j) {
            W::values(w[j] + at, lo[j], hi[j]);
            dx[j] = half(w[j] + at);
        }
        for (int a = 0; a < A; ++a) {
            const uint8_t * q = y.q[a] + size_t(b) * W::kActBytes + W::kActQs;
            const int8x16_t yl = load_s8(q), yh = load_s8(q + 16);
            const float dy = y.d[a][b];
            for (int j = 0; j < kTile; ++j) {
                const float32x4_t p = vcvtq_f32_s32(lanes(lo[j], hi[j], yl, yh));
                acc[a][j] = vaddq_f32(acc[a][j], vmulq_n_f32(p, dx[j] * dy));  // vmlaq_n_f32
            }
        }
    }
    for (int a = 0; a < A; ++a) {
        for (int j = 0; j < kTile; ++j) {
            if (parity == 0) {
                sum[a][j] = vaddvq_f32(acc[a][j]);
            } else {
                sum[a][j] = sum[a][j] + vaddvq_f32(acc[a][j]);
            }
        }
    }
}

// q4_1's running sum, pair by pair, of the blocks' minimum times the
// activations' sum, added after the two accumulators' sums
template <int A>
void add_mins(const uint8_t * const * w, const ActRows & y, int pairs, float (*sum)[kTile]) {
    for (int a = 0; a < A; ++a) {
        for (int j = 0; j < kTile; ++j) {
            float summs = 0;
            for (int i = 0; i < pairs; ++i) {
                const uint8_t * x0 = w[j] + size_t(2 * i) * Q4_1::kBytes;
                const uint8_t * x1 = x0 + Q4_1::kBytes;
                summs = summs + std::fma(half(x0 + 2), y.s[a][2 * i], half(x1 + 2) * y.s[a][2 * i + 1]);
            }
            sum[a][j] = sum[a][j] + summs;
        }
    }
}

// Weight rows w[0..3] by A activation rows, `nb` blocks each: out[a * ldo +
// j] = vec_dot of weight row j and activation row a.
template <class W, int A>
void tile(const uint8_t * const * w, const ActRows & y, int nb, float * out, int64_t ldo) {
    const int pairs = nb / 2;
    float sum[A][kTile];
    pass<W, A>(w, y, pairs, 0, sum);
    pass<W, A>(w, y, pairs, 1, sum);
    if constexpr (W::kActBytes == 36) add_mins<A>(w, y, pairs, sum);
    if (nb % 2 != 0) {
        const int b = nb - 1;
        for (int j = 0; j < kTile; ++j) {
            const uint8_t * x = w[j] + size_t(b) * W::kBytes;
            int8x16_t lo, hi;
            W::values(x, lo, hi);
            for (int a = 0; a < A; ++a) {
                const uint8_t * q = y.q[a] + size_t(b) * W::kActBytes + W::kActQs;
                const int sumi = vaddvq_s32(lanes(lo, hi, load_s8(q), load_s8(q + 16)));
                const float sy = W::kActBytes == 36 ? y.s[a][b] : 0.0f;
                sum[a][j] = W::tail(sum[a][j], sumi, half(x), y.d[a][b], half(x + 2), sy);
            }
        }
    }
    for (int a = 0; a < A; ++a) {
        for (int j = 0; j < kTile; ++j) out[a * ldo + j] = sum[a][j];
    }
}

// K-quants: super-blocks of 256 values by q8_K activations (float d, 256
// int8, 16 int16 sums of 16 values each). ggml's NEON vec_dot sums each
// super-block's integers exactly and adds them to the row's sum in one or two
// fused multiply-adds; so does a tile, whatever the order of the integers.
constexpr size_t kQ8KBytes = 292, kQ8KQs = 4, kQ8KSums = 260;

// q4_K (fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of
// nibbles): sum = fma(-mins, y.d * dmin, sum), then fma(sumi, y.d * d, sum).
struct Q4_K {
    static constexpr size_t kBytes = 144;
    // the eight scales (sc) and mins (mn) of sub-blocks of 32 values
    static void scales(const uint8_t * x, uint8_t * sc, uint8_t * mn) {
        uint32_t u[3];
        std::memcpy(u, x + 4, 12);
        const uint32_t six = 0x3f3f3f3f, four = 0x0f0f0f0f, two = 0x03030303;
        const uint32_t s[2] = {u[0] & six, (u[2] & four) | (((u[0] >> 6) & two) << 4)};
        const uint32_t m[2] = {u[1] & six, ((u[2] >> 4) & four) | (((u[1] >> 6) & two) << 4)};
        std::memcpy(sc, s, 8);
        std::memcpy(mn, m, 8);
    }
};

template <int A>
void tile_q4_k(const uint8_t * const * w, const ActRows & y, int nb, float * out, int64_t ldo) {
    float sum[A][kTile] = {};
    for (int b = 0; b < nb; ++b) {
        const uint8_t * x[kTile];
        uint8_t sc[kTile][8], mn[kTile][8];
        for (int j = 0; j < kTile; ++j) {
            x[j] = w[j] + size_t(b) * Q4_K::kBytes;
            Q4_K::scales(x[j], sc[j], mn[j]);
        }
        int32x4_t acc[A][kTile];
        for (int a = 0; a < A; ++a) {
            for (int j = 0; j < kTile; ++j) acc[a][j] = vdupq_n_s32(0);
        }
        for (int s = 0; s < 8; ++s) {  // sub-blocks: 32 nibbles, low (even s) or high (odd s) of 32 bytes
            int8x16_t lo[kTile], hi[kTile];
            for (int j = 0; j < kTile; ++j) {
                const uint8_t * q = x[j] + 16 + 32 * (s / 2);
                const uint8x16_t v0 = vld1q_u8(q), v1 = vld1q_u8(q + 16), m4 = vdupq_n_u8(0x0F);
                lo[j] = vreinterpretq_s8_u8(s % 2 == 0 ? vandq_u8(v0, m4) : vshrq_n_u8(v0, 4));
                hi[j] = vreinterpretq_s8_u8(s % 2 == 0 ? vandq_u8(v1, m4) : vshrq_n_u8(v1, 4));
            }
            for (int a = 0; a < A; ++a) {
                const uint8_t * q = y.q[a] + size_t(b) * kQ8KBytes + kQ8KQs + 32 * s;
                const int8x16_t yl = load_s8(q), yh = load_s8(q + 16);
                for (int j = 0; j < kTile; ++j)
                    acc[a][j] = vmlaq_n_s32(acc[a][j], lanes(lo[j], hi[j], yl, yh), sc[j][s]);
            }
        }
        for (int a = 0; a < A; ++a) {
            int16_t bsums[16];
            std::memcpy(bsums, y.q[a] + size_t(b) * kQ8KBytes + kQ8KSums, sizeof(bsums));
            const float dy = y.d[a][b];
            for (int j = 0; j < kTile; ++j) {
                int32_t mins = 0;
                for (int s = 0; s < 8; ++s) mins += int32_t(mn[j][s]) * (bsums[2 * s] + bsums[2 * s + 1]);
                sum[a][j] = std::fma(-float(mins), dy * half(x[j] + 2), sum[a][j]);
                sum[a][j] = std::fma(float(vaddvq_s32(acc[a][j])), dy * half(x[j]), sum[a][j]);
            }
        }
    }
    for (int a = 0; a < A; ++a) {
        for (int j = 0; j < kTile; ++j) out[a * ldo + j] = sum[a][j];
    }
}

// q6_K (128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales of 16
// values, fp16 d): sum = fma(d * y.d, sumi - 32 * sum of scales times
// activation sums, sum); the values minus 32 give that integer directly.
constexpr size_t kQ6KBytes = 210;

// the 16 values of group g (0-7) of half h of a q6_K super-block, minus 32
inline int8x16_t q6_k_group(const uint8_t * x, int h, int g) {
    const uint8x16_t ql = vld1q_u8(x + 64 * h + 16 * (g % 4));
    const uint8x16_t qh = vld1q_u8(x + 128 + 32 * h + 16 * (g % 2));
    const uint8x16_t low = g < 4 ? vandq_u8(ql, vdupq_n_u8(0x0F)) : vshrq_n_u8(ql, 4);
    const uint8x16_t high = vshlq_n_u8(vandq_u8(vshlq_u8(qh, vdupq_n_s8(int8_t(-2 * (g / 2)))), vdupq_n_u8(3)), 4);
    return vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low, high)), vdupq_n_s8(32));
}

template <int A>
void tile_q6_k(const uint8_t * const * w, const ActRows & y, int nb, float * out, int64_t ldo) {
    float sum[A][kTile] = {};
    for (int b = 0; b < nb; ++b) {
        const uint8_t * x[kTile];
        for (int j = 0; j < kTile; ++j) x[j] = w[j] + size_t(b) * kQ6KBytes;
        int32x4_t acc[A][kTile];
        for (int a = 0; a < A; ++a) {
            for (int j = 0; j < kTile; ++j) acc[a][j] = vdupq_n_s32(0);
        }
        for (int h = 0; h < 2; ++h) {
            for (int g = 0; g < 8; ++g) {
                int8x16_t v[kTile];
                for (int j = 0; j < kTile; ++j) v[j] = q6_k_group(x[j], h, g);
                for (int a = 0; a < A; ++a) {
                    const int8x16_t q = load_s8(y.q[a] + size_t(b) * kQ8KBytes + kQ8KQs + 128 * h + 16 * g);
                    for (int j = 0; j < kTile; ++j) {
                        const int scale = int8_t(x[j][192 + 8 * h + g]);
                        acc[a][j] = vmlaq_n_s32(acc[a][j], vdotq_s32(vdupq_n_s32(0), v[j], q), scale);
                    }
                }
            }
        }
        for (int a = 0; a < A; ++a) {
            for (int j = 0; j < kTile; ++j) {
                sum[a][j] = std::fma(half(x[j] + 208) * y.d[a][b], float(vaddvq_s32(acc[a][j])), sum[a][j]);
            }
        }
    }
    for (int a = 0; a < A; ++a) {
        for (int j = 0; j < kTile; ++j) out[a * ldo + j] = sum[a][j];
    }
}

using TileFn = void (*)(const uint8_t * const *, const ActRows &, int, float *, int64_t);

// A type's tile functions, by activation rows (1 to 4).
const TileFn * tile_fns(ggml_type type) {
    static const TileFn q4_1[] = {tile<Q4_1, 1>, tile<Q4_1, 2>, tile<Q4_1, 3>, tile<Q4_1, 4>};
    static const TileFn q5_0[] = {tile<Q5_0, 1>, tile<Q5_0, 2>, tile<Q5_0, 3>, tile<Q5_0, 4>};
    static const TileFn q8_0[] = {tile<Q8_0, 1>, tile<Q8_0, 2>, tile<Q8_0, 3>, tile<Q8_0, 4>};
    static const TileFn q4_k[] = {tile_q4_k<1>, tile_q4_k<2>, tile_q4_k<3>, tile_q4_k<4>};
    static const TileFn q6_k[] = {tile_q6_k<1>, tile_q6_k<2>, tile_q6_k<3>, tile_q6_k<4>};
    switch (type) {
        case GGML_TYPE_Q4_1: return q4_1;
        case GGML_TYPE_Q5_0: return q5_0;
        case GGML_TYPE_Q4_K: return q4_k;
        case GGML_TYPE_Q6_K: return q6_k;
        default: return q8_0;
    }
}

// The scales (and q8_1's sums) of `n` quantized activation rows as floats,
// block by block: d[i * nb + b], s[i * nb + b].
void act_scales(ggml_type type, const uint8_t * act, size_t row_bytes, int64_t n, int nb, std::vector<float> & d,
                std::vector<float> & s) {
    const bool q8_1 = type == GGML_TYPE_Q4_1, q8_k = type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K;
    const size_t block = q8_1 ? Q4_1::kActBytes : q8_k ? kQ8KBytes : Q8_0::kActBytes;
    d.resize(size_t(n) * size_t(nb));
    s.resize(q8_1 ? d.size() : 0);
    for (int64_t i = 0; i < n; ++i) {
        for (int b = 0; b < nb; ++b) {
            const uint8_t * blk = act + size_t(i) * row_bytes + size_t(b) * block;
            float & to = d[size_t(i) * size_t(nb) + size_t(b)];
            if (q8_k) {
                std::memcpy(&to, blk, sizeof(float));
            } else {
                to = half(blk);
            }
            if (q8_1) s[size_t(i) * size_t(nb) + size_t(b)] = half(blk + 2);
        }
    }
}

}  // namespace

void product(ggml_type type, const uint8_t * weights, size_t w_row_bytes, int64_t r0, int64_t r1, const uint8_t * act,
             size_t act_row_bytes, int64_t n_act, int nb, float * dst, int64_t ld_dst) {
    constexpr int64_t kActChunk = 64;  // activation rows kept hot in cache across weight tiles
    thread_local std::vector<float> scale_d, scale_s;
    const TileFn * tile_fn = tile_fns(type);
    for (int64_t a0 = 0; a0 < n_act; a0 += kActChunk) {
        const int64_t a_end = std::min(n_act, a0 + kActChunk);
        act_scales(type, act + size_t(a0) * act_row_bytes, act_row_bytes, a_end - a0, nb, scale_d, scale_s);
        for (int64_t r = r0; r < r1; r += kTile) {
            const uint8_t * w[kTile];
            for (int j = 0; j < kTile; ++j) w[j] = weights + size_t(r + j) * w_row_bytes;
            for (int64_t a = a0; a < a_end; a += kTile) {
                const int n = int(std::min<int64_t>(kTile, a_end - a));
                ActRows y{};
                for (int i = 0; i < n; ++i) {
                    const size_t at = size_t(a - a0 + i) * size_t(nb);
                    y.q[i] = act + size_t(a + i) * act_row_bytes;
                    y.d[i] = scale_d.data() + at;
                    y.s[i] = scale_s.empty() ? nullptr : scale_s.data() + at;
                }
                tile_fn[n - 1](w, y, nb, dst + a * ld_dst + r, ld_dst);
            }
        }
    }
}

}  // namespace lmsp::neon

#endif
