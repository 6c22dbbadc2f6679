// Tiled matrix products that give ggml-cpu's one-row bits.
//
// With llamafile's sgemm and weight repacking off (batch_plan.cpp), ggml-cpu
// multiplies a q4_1, q5_0 or q8_0 weight matrix by many rows one dot product at a
// time (vec_dot): each element unpacks its weight blocks again, and a prompt
// of 68 tokens costs about as much as 27 single decode steps. Here a 4 x 4
// tile of weight rows and activation rows is computed at once: each weight
// block is unpacked once for four rows, each pair of weight rows shares a
// 512-bit register. Every element is computed exactly as vec_dot computes it
// on x86: the same eight int32 lanes per block (integer sums, exact in any
// instruction), the same float multiply of the two scales, the same fused
// multiply-add into eight float lanes, block after block, the same
// horizontal sum, and for q4_1 the same fused sum of the blocks' minimum
// times the activations' sums. So the numbers are ggml's, bit for bit,
// whatever the tile, the rows beside a row or the threads: batch invariance
// holds as before, and the tiles only take less time.
//
// They are hooked in as an "extra buffer type" of ggml's CPU backend, the
// way ggml's repacked weights are, but they hold no weights: the weights stay
// where llama.cpp put them (a mapped file, say), and the hook claims the
// matrix products of plain q4_1, q5_0 and q8_0 weights by 2 or more rows; ggml's
// own path does the rest. The activations are quantized into ggml's work
// buffer exactly as its own path does. At install each type is checked
// against ggml's vec_dot on random data and taken only where every element
// matches bit for bit (ggml's compiler might sum in another order).
//
// On ARM (NEON with the dot-product extension) the tiles are those of
// tile_matmul_neon.cpp, with ggml's aarch64 one-row bits.

#include "tile_matmul.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "traits.h"  // ggml/src/ggml-cpu of the pinned source: the extra buffer types

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define LMSP_TILES 1
#elif defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
#include "tile_matmul_neon.h"  // the tiles on ARM, in a file of their own
#define LMSP_TILES 1
#define LMSP_TILES_NEON 1
#endif

namespace lmsp {

namespace {

constexpr int kBlock = 32;  // values per block in q4_1, q5_0, q8_0, q8_1
constexpr int kTile = 4;    // weight rows and activation rows of a tile
constexpr int64_t kMinRows = 2;

std::atomic<bool> g_on{true};
// the weight types the tiles compute, each taken once its check passed
struct TileType {
    ggml_type type;
    const char * name;
    std::atomic<bool> on{false};
};

TileType g_types[] = {{GGML_TYPE_Q4_1, "q4_1"}, {GGML_TYPE_Q5_0, "q5_0"}, {GGML_TYPE_Q8_0, "q8_0"}};
std::atomic<int64_t> g_products{0};

#if defined(LMSP_TILES) && !defined(LMSP_TILES_NEON)

inline float half(const uint8_t * p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

inline int32_t load32(const uint8_t * p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// vec_dot's horizontal sum of eight lanes (hsum_float_8 of ggml's x86 code)
inline float hsum8(const float * t) { return ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7])); }

// The activation rows of a tile: their quantized values, and per block
// their scale (and for q8_1 the scale times the sum) as floats.
struct ActRows {
    const uint8_t * q[4];
    const float * d[4];
    const float * s[4];
};

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

// Weight rows w[0..3] by A activation rows, `nb` blocks each; out[a * ldo + j]
// = the product of weight row j and activation row a. q4_1 blocks: fp16 d,
// fp16 m, 16 bytes of nibbles (20 bytes); q8_1: fp16 d, fp16 s, 32 int8.
template <int A>
void tile_q4_1(const uint8_t * const * w, const ActRows & y, int nb, float * out, int64_t ldo) {
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
            const __m512 dy = _mm512_set1_ps(y.d[a][b]);
            summs[a] = _mm_fmadd_ps(m4, _mm_set1_ps(y.s[a][b]), summs[a]);
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
void tile_signed(const uint8_t * const * w, const ActRows & y, int nb, float * out, int64_t ldo) {
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
            const __m512 dy = _mm512_set1_ps(y.d[a][b]);
            for (int p = 0; p < 2; ++p) {
                const __m512i sy = _mm512_mask_sub_epi8(qy, neg[p], zero, qy);
                const __m512 xy = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, ax[p], sy));
                acc[a][p] = _mm512_fmadd_ps(_mm512_mul_ps(dw[p], dy), xy, acc[a][p]);
            }
        }
    }
    finish_tile(acc, A, nullptr, out, ldo);
}

using TileFn = void (*)(const uint8_t * const *, const ActRows &, int, float *, int64_t);

// A type's tile functions, by activation rows (1 to 4).
const TileFn * tile_fns(ggml_type type) {
    static const TileFn q4_1[] = {tile_q4_1<1>, tile_q4_1<2>, tile_q4_1<3>, tile_q4_1<4>};
    static const TileFn q5_0[] = {tile_signed<Q5_0Weights, 1>, tile_signed<Q5_0Weights, 2>, tile_signed<Q5_0Weights, 3>,
                                  tile_signed<Q5_0Weights, 4>};
    static const TileFn q8_0[] = {tile_signed<Q8_0Weights, 1>, tile_signed<Q8_0Weights, 2>, tile_signed<Q8_0Weights, 3>,
                                  tile_signed<Q8_0Weights, 4>};
    return type == GGML_TYPE_Q4_1 ? q4_1 : type == GGML_TYPE_Q5_0 ? q5_0 : q8_0;
}

// The scales (and q8_1's sums) of `n` quantized activation rows as floats,
// block by block: d[i * nb + b], s[i * nb + b].
void act_scales(ggml_type type, const uint8_t * act, size_t row_bytes, int64_t n, int nb, std::vector<float> & d,
                std::vector<float> & s) {
    const bool q8_1 = type == GGML_TYPE_Q4_1;
    const size_t block = q8_1 ? 36 : 34;
    d.resize(size_t(n) * size_t(nb));
    s.resize(q8_1 ? d.size() : 0);
    for (int64_t i = 0; i < n; ++i) {
        for (int b = 0; b < nb; ++b) {
            const uint8_t * blk = act + size_t(i) * row_bytes + size_t(b) * block;
            d[size_t(i) * size_t(nb) + size_t(b)] = half(blk);
            if (q8_1) s[size_t(i) * size_t(nb) + size_t(b)] = half(blk + 2);
        }
    }
}

// Weight rows [r0, r1) (a multiple of the tile) by every activation row:
// dst row a, column r, from the quantized rows of `act` (row_bytes apart).
void product(ggml_type type, const uint8_t * weights, size_t w_row_bytes, int64_t r0, int64_t r1, const uint8_t * act,
             size_t act_row_bytes, int64_t n_act, int nb, float * dst, int64_t ld_dst) {
    constexpr int64_t kActChunk = 64;  // activation rows kept hot in cache across weight tiles
    thread_local std::vector<float> scale_d, scale_s;
    const TileFn * tile = tile_fns(type);
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
                tile[n - 1](w, y, nb, dst + a * ld_dst + r, ld_dst);
            }
        }
    }
}

#elif defined(LMSP_TILES_NEON)
using neon::product;
#endif  // LMSP_TILES

bool type_on(ggml_type type) {
    for (const TileType & t : g_types) {
        if (t.type == type) return t.on.load(std::memory_order_relaxed);
    }
    return false;
}

// The products the tiles take: plain (not repacked) 2-D weights of a type
// that passed its check, by two or more f32 rows, into f32.
bool takes(const ggml_tensor * op) {
    if (op->op != GGML_OP_MUL_MAT || !g_on.load(std::memory_order_relaxed)) return false;
    const ggml_tensor * w = op->src[0];
    const ggml_tensor * x = op->src[1];
    if (!type_on(w->type) || w->extra != nullptr || w->buffer == nullptr || !ggml_backend_buffer_is_host(w->buffer)) {
        return false;
    }
    if (op->op_params[1] != 0) return false;  // a hint (a Hadamard transform) ggml computes its own way
    return w->ne[2] == 1 && w->ne[3] == 1 && ggml_is_contiguous(w) && w->ne[0] % kBlock == 0 && w->ne[1] % kTile == 0 &&
           x->type == GGML_TYPE_F32 && x->ne[2] == 1 && x->ne[3] == 1 && x->nb[0] == sizeof(float) &&
           x->ne[1] >= kMinRows && op->type == GGML_TYPE_F32 && op->nb[0] == sizeof(float) && op->ne[2] == 1 &&
           op->ne[3] == 1;
}

class TileTraits : public ggml::cpu::tensor_traits {
public:
    // the work buffer ggml's own path asks for: the quantized activations
    bool work_size(int, const ggml_tensor *, size_t &) override { return false; }

    bool compute_forward(ggml_compute_params * params, ggml_tensor * op) override {
#ifdef LMSP_TILES
        const ggml_tensor * w = op->src[0];
        const ggml_tensor * x = op->src[1];
        const ggml_type q = ggml_get_type_traits_cpu(w->type)->vec_dot_type;
        const ggml_from_float_t quantize = ggml_get_type_traits_cpu(q)->from_float;
        const int64_t k = x->ne[0];
        const int64_t n = x->ne[1];
        const size_t q_row = ggml_row_size(q, k);
        auto * wdata = static_cast<uint8_t *>(params->wdata);
        // as ggml quantizes them: each thread a share of every row's blocks
        const int ith = params->ith, nth = params->nth;
        const int64_t b0 = (ith * k / kBlock) / nth, b1 = ((ith + 1) * k / kBlock) / nth;
        for (int64_t i = 0; i < n; ++i) {
            const float * row = reinterpret_cast<const float *>(static_cast<const char *>(x->data) + i * x->nb[1]);
            quantize(row + b0 * kBlock, wdata + i * q_row + b0 * ggml_type_size(q), (b1 - b0) * kBlock);
        }
        if (ith == 0) g_products.fetch_add(1, std::memory_order_relaxed);
        ggml_barrier(params->threadpool);
        const int64_t tiles = w->ne[1] / kTile;
        const int64_t t0 = tiles * ith / nth, t1 = tiles * (ith + 1) / nth;
        product(w->type, static_cast<const uint8_t *>(w->data), w->nb[1], t0 * kTile, t1 * kTile, wdata, q_row, n,
                int(k / kBlock), static_cast<float *>(op->data), int64_t(op->nb[1] / sizeof(float)));
        return true;
#else
        (void)params;
        (void)op;
        return false;
#endif
    }
};

class TileHook : public ggml::cpu::extra_buffer_type {
public:
    // never a home for weights: they stay in llama.cpp's buffers
    bool supports_op(ggml_backend_dev_t, const ggml_tensor *) override { return false; }

    ggml::cpu::tensor_traits * get_tensor_traits(const ggml_tensor * op) override {
        return takes(op) ? &traits_ : nullptr;
    }

private:
    TileTraits traits_;
};

const char * hook_name(ggml_backend_buffer_type_t) { return "LMSP_TILES"; }

#ifdef LMSP_TILES
// Random weights of `type` and activations quantized as ggml's path does.
struct CheckData {
    std::vector<uint8_t> weights, act;
    size_t w_row = 0, a_row = 0;
};

CheckData check_data(ggml_type type, int rows, int n, int k, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> wf(size_t(rows) * size_t(k)), af(size_t(n) * size_t(k));
    for (float & v : wf) v = normal(rng);
    for (float & v : af) v = normal(rng) * 3.0f;
    CheckData d;
    const ggml_type q = ggml_get_type_traits_cpu(type)->vec_dot_type;
    d.w_row = ggml_row_size(type, k);
    d.a_row = ggml_row_size(q, k);
    d.weights.resize(d.w_row * size_t(rows));
    d.act.resize(d.a_row * size_t(n));
    ggml_quantize_chunk(type, wf.data(), d.weights.data(), 0, rows, k, nullptr);
    for (int i = 0; i < n; ++i) {
        ggml_get_type_traits_cpu(q)->from_float(af.data() + size_t(i) * size_t(k), d.act.data() + size_t(i) * d.a_row,
                                                k);
    }
    return d;
}

bool matches(ggml_type type, int rows, int n, int k, uint32_t seed) {
    if (rows % kTile != 0 || k % kBlock != 0 || n < 1 || rows < kTile) return false;
    ggml_cpu_init();  // ggml's fp16 table, which vec_dot reads
    const CheckData d = check_data(type, rows, n, k, seed);
    std::vector<float> tiled(size_t(n) * size_t(rows));
    product(type, d.weights.data(), d.w_row, 0, rows, d.act.data(), d.a_row, n, k / kBlock, tiled.data(), rows);
    const ggml_vec_dot_t dot = ggml_get_type_traits_cpu(type)->vec_dot;
    for (int a = 0; a < n; ++a) {
        for (int r = 0; r < rows; ++r) {
            float one = 0.0f;
            dot(k, &one, 0, d.weights.data() + size_t(r) * d.w_row, 0, d.act.data() + size_t(a) * d.a_row, 0, 1);
            if (std::memcmp(&one, &tiled[size_t(a) * size_t(rows) + size_t(r)], sizeof(float)) != 0) return false;
        }
    }
    return true;
}

// The install-time check of a type: row counts of every tile shape, block
// counts of the catalog models' matrices, and an odd one (ggml's ARM code
// adds a last odd block on its own).
bool type_checks(ggml_type type) {
    uint32_t seed = 1;
    for (const int k : {64, 96, 576, 1536}) {
        for (const int n : {1, 2, 3, 4, 5, 7}) {
            if (!matches(type, 8, n, k, seed++)) return false;
        }
    }
    return true;
}
#endif

}  // namespace

void install_tile_matmul() {
    static std::once_flag once;
    std::call_once(once, [] {
#ifdef LMSP_TILES
        ggml_cpu_init();
        // the CPU device copies the list of extra buffer types on its first
        // use, and llama.cpp places weights by that copy: make it before the
        // hook joins, so that weights never go to the hook (nor would they:
        // supports_op says no)
        ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        if (cpu == nullptr) return;
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cpu);
        using ExtraBufts = ggml_backend_buffer_type_t * (*)(ggml_backend_dev_t);
        auto extra = reinterpret_cast<ExtraBufts>(
            ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
        if (extra != nullptr) extra(cpu);
        for (TileType & t : g_types) t.on = type_checks(t.type);
        static TileHook hook;
        static ggml_backend_buffer_type buft = {
            /* .iface = */ {hook_name, nullptr, nullptr, nullptr, nullptr, nullptr},
            /* .device = */ cpu,
            /* .context = */ &hook,
        };
        ggml_backend_cpu_get_extra_buffer_types().push_back(&buft);
        const char * env = std::getenv("LMSP_TILE_MATMUL");
        if (env != nullptr && std::strcmp(env, "0") == 0) g_on = false;
#endif
    });
}

std::vector<std::string> tile_matmul_types() {
    std::vector<std::string> out;
    if (!g_on.load()) return out;
    for (const TileType & t : g_types) {
        if (t.on.load()) out.emplace_back(t.name);
    }
    return out;
}

void set_tile_matmul(bool on) { g_on = on; }

int64_t tile_matmul_products() { return g_products.load(); }

bool tile_matmul_built() {
#ifdef LMSP_TILES
    return true;
#else
    return false;
#endif
}

bool tile_matmul_matches(const std::string & type, int rows, int n, int k, uint32_t seed) {
#ifdef LMSP_TILES
    for (const TileType & t : g_types) {
        if (type == t.name) return matches(t.type, rows, n, k, seed);
    }
#else
    (void)type;
    (void)rows;
    (void)n;
    (void)k;
    (void)seed;
#endif
    return false;
}

}  // namespace lmsp
