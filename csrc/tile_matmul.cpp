// Tiled matrix products that give ggml-cpu's one-row bits.
//
// With llamafile's sgemm and weight repacking off (batch_plan.cpp), ggml-cpu
// multiplies a q4_1, q5_0 or q8_0 weight matrix by many rows one dot product at a
// time (vec_dot): each element unpacks its weight blocks again, and a prompt
// of 68 tokens costs about as much as 27 single decode steps. Here a 4 x 4
// tile of weight rows and activation rows is computed at once, each weight
// block unpacked once for four rows (tile_matmul_kernels.h: the kernels of
// each instruction set). Every element is computed exactly as vec_dot
// computes it on the instruction set the build targets: the same int32
// lanes per block (integer sums, exact in any instruction), the same float
// products of the scales, the same fused multiply-adds into eight float
// lanes, block after block, the same horizontal sums. So the numbers are
// ggml's, bit for bit, whatever the tile, the rows beside a row or the
// threads: batch invariance holds as before, and the tiles only take less
// time.
//
// The K-quants q4_K and q6_K are computed by vec_dot in ggml's one-row
// steps (the reference kernels, csrc/llama_private.cpp) and for products of
// fewer than 8 rows; ggml's own tiled K-quant matmul takes the others on x86,
// with other bits. Where the tiles replace it (kKquantTilesFirst: ARM, where
// ggml has none, and x86 without AVX-512 VNNI, where the tiles measured
// faster) they take every q4_K and q6_K product of two rows or more, and
// with the tiles off the hook computes those of 8 rows or more with vec_dot
// row by row: these products then have vec_dot's bits whatever the rows, with
// tiles or without. With AVX-512 VNNI ggml's tiled matmul keeps them: its
// microkernels sum a whole sub-block in one lane, one instruction for 64
// products, where vec_dot's bits need a lane for each four bytes of a
// sub-block and the sub-block's scale on each (two instructions), and it
// measured faster than the tiles there on Gemma 3's prompts.
//
// They are hooked in as an "extra buffer type" of ggml's CPU backend, the
// way ggml's repacked weights are, but they hold no weights: the weights stay
// where llama.cpp put them (a mapped file, say), and the hook claims the
// matrix products of plain weights of those types by 2 or more rows; ggml's
// own path does the rest. The activations are quantized into ggml's work
// buffer with the bytes its own path writes (q8_K by tile_quantize.cpp). At
// install each type is checked against ggml's vec_dot on random data and
// taken only where every element matches bit for bit (ggml's compiler might
// sum in another order). The threads share a product out in pieces, as
// ggml's own matrix products do (tile_product.cpp).
//
// On ARM (NEON with the dot-product extension) the tiles are those of
// tile_matmul_neon.cpp, with ggml's aarch64 one-row bits.

#include "tile_matmul.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "tile_matmul_kernels.h"
#include "tiled/tiled.h"  // ggml/src/ggml-cpu of the pinned source: its tiled K-quant matmul
#include "traits.h"       // and the extra buffer types

#if defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
#include "tile_matmul_neon.h"  // the tiles on ARM, in a file of their own
#define LMSP_TILES_NEON 1
#else
#include "tile_product.h"  // the tiles on x86, put to work on a whole product
#endif

namespace lmsp {

namespace {

using tiles::kTile;

constexpr int64_t kMinRows = 2;
// ggml's tiled K-quant matmul (ggml-cpu/tiled) takes products of this many rows
constexpr int64_t kGgmlTiledRows = 8;

std::atomic<bool> g_on{true};
// the weight types the tiles compute, each taken once its check passed
struct TileType {
    ggml_type type;
    const char * name;
    std::atomic<bool> on{false};
};

TileType g_types[] = {{GGML_TYPE_Q4_1, "q4_1"}, {GGML_TYPE_Q5_0, "q5_0"}, {GGML_TYPE_Q8_0, "q8_0"},
                      {GGML_TYPE_Q4_K, "q4_K"}, {GGML_TYPE_Q6_K, "q6_K"}, {GGML_TYPE_F16, "f16"}};
std::atomic<int64_t> g_products{0};
// products of ggml's tiled K-quant matmul on activations the hook quantized
std::atomic<int64_t> g_ggml_tiled_q8k{0};

bool is_kquant(ggml_type type) { return type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K; }

// tile_quantize.cpp's q8_K whose check passed, which then quantizes the
// K-quants' activations instead of ggml's element-by-element reference code;
// nullptr: none did.
std::atomic<tiles::QuantizeFn> g_q8k{nullptr};

// How the hook quantizes activations of type `act`: as ggml does, with
// ggml's bytes.
ggml_from_float_t act_quantizer(ggml_type act) {
    if (act == GGML_TYPE_Q8_K) {
        if (const tiles::QuantizeFn q = g_q8k.load(std::memory_order_relaxed)) return q;
    }
    return ggml_get_type_traits_cpu(act)->from_float;
}

// Where the tiles take the K-quant products ggml's tiled matmul would (the
// note at the top): ARM and x86 without the AVX-512 that ggml's tiled
// microkernels take (ggml-cpu/tiled/tiled-kernel.cpp: VNNI, VL and DQ).
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
constexpr bool kKquantTilesFirst = false;
#else
constexpr bool kKquantTilesFirst = true;
#endif

#if defined(LMSP_TILES_NEON)
// ARM: the NEON tiles (tile_matmul_neon.cpp), the legacy types and the K-quants.
bool has_tiles(ggml_type type) {
    return type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q8_0 || is_kquant(type);
}
using neon::product;

int64_t row_multiple(ggml_type type) { return ggml_blck_size(type); }
#else
using x86::has_tiles;
using x86::product;
using x86::row_multiple;
using x86::shared_product;
#endif

bool type_on(ggml_type type) {
    for (const TileType & t : g_types) {
        if (t.type == type) return t.on.load(std::memory_order_relaxed);
    }
    return false;
}

// The products the tiles take: plain (not repacked) 2-D weights of a type
// that passed its check, by two or more f32 rows, into f32. With the tiles
// off, the K-quant products they replace ggml's tiled matmul for (above).
bool takes(const ggml_tensor * op) {
    if (op->op != GGML_OP_MUL_MAT) return false;
    const ggml_tensor * w = op->src[0];
    const ggml_tensor * x = op->src[1];
    if (!g_on.load(std::memory_order_relaxed) && !(kKquantTilesFirst && is_kquant(w->type))) return false;
    if (!type_on(w->type) || w->extra != nullptr || w->buffer == nullptr || !ggml_backend_buffer_is_host(w->buffer)) {
        return false;
    }
    if (op->op_params[1] != 0) return false;  // a hint (a Hadamard transform) ggml computes its own way
    return w->ne[2] == 1 && w->ne[3] == 1 && ggml_is_contiguous(w) && w->ne[0] % row_multiple(w->type) == 0 &&
           w->ne[1] % kTile == 0 && x->type == GGML_TYPE_F32 && x->ne[2] == 1 && x->ne[3] == 1 &&
           x->nb[0] == sizeof(float) && x->ne[1] >= kMinRows && op->type == GGML_TYPE_F32 &&
           op->nb[0] == sizeof(float) && op->ne[2] == 1 && op->ne[3] == 1;
}

// ggml's switches of its tiled K-quant matmul, read as ggml reads them
// (GGML_CPU_TILED_MM: on unless 0; GGML_CPU_TILED_MM_FORCE=1: for any rows).
struct GgmlTiled {
    bool on = true;
    bool forced = false;
};

const GgmlTiled & ggml_tiled() {
    static const GgmlTiled t = [] {
        GgmlTiled g;
        const char * on = std::getenv("GGML_CPU_TILED_MM");
        const char * forced = std::getenv("GGML_CPU_TILED_MM_FORCE");
        g.on = on == nullptr || std::atoi(on) != 0;
        g.forced = forced != nullptr && std::atoi(forced) == 1;
        return g;
    }();
    return t;
}

// ggml-cpu/tiled computes K-quant products only where the target has AVX (its
// ggml_tiled_supported); elsewhere (ARM) ggml's path is vec_dot's.
#if defined(__AVX512VNNI__) || defined(__AVX2__) || defined(__AVX__)
constexpr bool kGgmlTiledMm = true;
#else
constexpr bool kGgmlTiledMm = false;
#endif

// Whether ggml computes this product with vec_dot: always for the legacy
// types; for the K-quants, unless its tiled K-quant matmul takes it.
bool ggml_uses_vec_dot(const ggml_compute_params * params, const ggml_tensor * op) {
    if (!is_kquant(op->src[0]->type) || params->use_ref || !kGgmlTiledMm) return true;
    const GgmlTiled & t = ggml_tiled();
    return !t.on || (op->src[1]->ne[1] < kGgmlTiledRows && !t.forced);
}

// Whether the hook computes this product with the tiles on (`tiled`), or
// with vec_dot row by row with them off: a K-quant product ggml's tiled
// matmul would take, where the tiles replace it.
bool hook_computes(const ggml_compute_params * params, const ggml_tensor * op, bool tiled) {
    if (!has_tiles(op->src[0]->type)) return false;
    const bool kquant_first = kKquantTilesFirst && is_kquant(op->src[0]->type) && !params->use_ref;
    return tiled ? kquant_first || ggml_uses_vec_dot(params, op) : kquant_first && !ggml_uses_vec_dot(params, op);
}

// Weight rows [r0, r1) by every activation row with vec_dot, one element at a
// time (what ggml computes with its tiled matmul off).
void one_row_products(const ggml_tensor * w, const uint8_t * act, size_t act_row_bytes, int64_t n, int64_t r0,
                      int64_t r1, ggml_tensor * op) {
    const ggml_vec_dot_t dot = ggml_get_type_traits_cpu(w->type)->vec_dot;
    const auto * weights = static_cast<const uint8_t *>(w->data);
    auto * dst = static_cast<float *>(op->data);
    const int64_t ld = int64_t(op->nb[1] / sizeof(float));
    for (int64_t a = 0; a < n; ++a) {
        for (int64_t r = r0; r < r1; ++r) {
            dot(int(w->ne[0]), dst + a * ld + r, 0, weights + size_t(r) * w->nb[1], 0, act + size_t(a) * act_row_bytes,
                0, 1);
        }
    }
}

// This thread's share of the activations' quantization (of every row, a
// share of its blocks, as ggml shares it) into `wdata`, rows of type `q`.
void quantize_share(const ggml_compute_params * params, const ggml_tensor * x, ggml_type q, ggml_from_float_t quantize,
                    uint8_t * wdata) {
    const int64_t k = x->ne[0];
    const int64_t bs = ggml_blck_size(q);
    const size_t q_row = ggml_row_size(q, k);
    const int64_t b0 = (params->ith * k / bs) / params->nth, b1 = ((params->ith + 1) * k / bs) / params->nth;
    for (int64_t i = 0; i < x->ne[1]; ++i) {
        const float * row = reinterpret_cast<const float *>(static_cast<const char *>(x->data) + i * x->nb[1]);
        quantize(row + b0 * bs, wdata + i * q_row + b0 * ggml_type_size(q), (b1 - b0) * bs);
    }
}

// A K-quant product the hook leaves to ggml's tiled K-quant matmul (AVX-512
// VNNI, 8 rows or more), given its activations as q8_K quantized by
// tile_quantize.cpp: the bytes of ggml's reference code, which that matmul
// quantizes with, written in less time. Then ggml's own driver computes the
// product as it does for activations that come quantized, with the work
// buffer laid out as it lays it out (the q8_K rows, then each thread's
// workspace): every element as without this. False: ggml's own path.
bool ggml_tiled_on_q8_K(const ggml_compute_params * params, ggml_tensor * op) {
    const tiles::QuantizeFn q8k = g_q8k.load(std::memory_order_relaxed);
    if (q8k == nullptr || !is_kquant(op->src[0]->type) || ggml_uses_vec_dot(params, op)) return false;
    const ggml_tensor * x = op->src[1];
    auto * wdata = static_cast<uint8_t *>(params->wdata);
    quantize_share(params, x, GGML_TYPE_Q8_K, q8k, wdata);
    ggml_tensor act = *x;
    act.type = GGML_TYPE_Q8_K;
    act.data = wdata;
    act.nb[0] = ggml_type_size(GGML_TYPE_Q8_K);
    act.nb[1] = ggml_row_size(GGML_TYPE_Q8_K, x->ne[0]);
    act.nb[2] = act.nb[1] * size_t(x->ne[1]);
    act.nb[3] = act.nb[2] * size_t(x->ne[2]);
    ggml_tensor product = *op;
    product.src[1] = &act;
    const size_t rows = GGML_PAD(ggml_row_size(GGML_TYPE_Q8_K, ggml_nelements(x)), 64);  // as ggml reserves them
    ggml_compute_params rest = *params;
    rest.wdata = wdata + rows;
    rest.wsize = params->wsize - rows;
    // its barrier, before the product, follows every thread's share above
    if (!ggml_compute_forward_mul_mat_tiled(&rest, &product)) return false;
    if (params->ith == 0) g_ggml_tiled_q8k.fetch_add(1, std::memory_order_relaxed);
    return true;
}

class TileTraits : public ggml::cpu::tensor_traits {
public:
    // the work buffer ggml's own path asks for: the quantized activations
    bool work_size(int, const ggml_tensor *, size_t &) override { return false; }

    bool compute_forward(ggml_compute_params * params, ggml_tensor * op) override {
        const ggml_tensor * w = op->src[0];
        const ggml_tensor * x = op->src[1];
        const bool tiled = g_on.load(std::memory_order_relaxed);
        if (!hook_computes(params, op, tiled)) return ggml_tiled_on_q8_K(params, op);
        const ggml_type q = ggml_get_type_traits_cpu(w->type)->vec_dot_type;
        const int64_t k = x->ne[0];
        const int64_t n = x->ne[1];
        const size_t q_row = ggml_row_size(q, k);
        auto * wdata = static_cast<uint8_t *>(params->wdata);
        quantize_share(params, x, q, act_quantizer(q), wdata);
        const int ith = params->ith, nth = params->nth;
        if (ith == 0 && tiled) {
            g_products.fetch_add(1, std::memory_order_relaxed);
            ggml_threadpool_chunk_set(params->threadpool, nth);  // shared_product's pieces
        }
        ggml_barrier(params->threadpool);
        const int64_t tiles = w->ne[1] / kTile;
        const int64_t t0 = tiles * ith / nth, t1 = tiles * (ith + 1) / nth;
        auto * dst = static_cast<float *>(op->data);
        const auto ld = int64_t(op->nb[1] / sizeof(float));
        if (!tiled) {
            one_row_products(w, wdata, q_row, n, t0 * kTile, t1 * kTile, op);
            return true;
        }
#if defined(LMSP_TILES_NEON)
        product(w->type, static_cast<const uint8_t *>(w->data), w->nb[1], t0 * kTile, t1 * kTile, wdata, q_row, n,
                int(k / ggml_blck_size(w->type)), dst, ld);
#else
        shared_product(params, w, wdata, q_row, n, dst, ld);
#endif
        return true;
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
        act_quantizer(q)(af.data() + size_t(i) * size_t(k), d.act.data() + size_t(i) * d.a_row, k);
    }
    return d;
}

bool matches(ggml_type type, int rows, int n, int k, uint32_t seed) {
    const int block = int(ggml_blck_size(type));
    if (!has_tiles(type) || rows % kTile != 0 || k % row_multiple(type) != 0 || n < 1 || rows < kTile) return false;
    ggml_cpu_init();  // ggml's fp16 table, which vec_dot reads
    const CheckData d = check_data(type, rows, n, k, seed);
    std::vector<float> tiled(size_t(n) * size_t(rows));
    product(type, d.weights.data(), d.w_row, 0, rows, d.act.data(), d.a_row, n, k / block, tiled.data(), rows);
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
    const std::vector<int> lengths = is_kquant(type)         ? std::vector<int>{256, 1024, 2048}
                                     : type == GGML_TYPE_F16 ? std::vector<int>{64, 128, 384, 1536}
                                                             : std::vector<int>{64, 96, 576, 1536};
    for (const int k : lengths) {
        for (const int n : {1, 2, 3, 4, 5, 7}) {
            if (!matches(type, 8, n, k, seed++)) return false;
        }
    }
    return true;
}

}  // namespace

void install_tile_matmul() {
    static std::once_flag once;
    std::call_once(once, [] {
        if (!tile_matmul_built()) return;
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
        g_q8k = tiles::checked_q8_K_quantizer();  // before the K-quant tiles' checks, which quantize with it
        for (TileType & t : g_types) t.on = has_tiles(t.type) && type_checks(t.type);
        static TileHook hook;
        static ggml_backend_buffer_type buft = {
            /* .iface = */ {hook_name, nullptr, nullptr, nullptr, nullptr, nullptr},
            /* .device = */ cpu,
            /* .context = */ &hook,
        };
        ggml_backend_cpu_get_extra_buffer_types().push_back(&buft);
        const char * env = std::getenv("LMSP_TILE_MATMUL");
        if (env != nullptr && std::strcmp(env, "0") == 0) g_on = false;
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

bool tile_matmul_kquants_first() { return kKquantTilesFirst && tile_matmul_built(); }

bool tile_matmul_built() {
    for (const TileType & t : g_types) {
        if (has_tiles(t.type)) return true;
    }
    return false;
}

bool tile_quantize_q8_K() { return g_q8k.load() != nullptr; }

int64_t tile_quantize_ggml_tiled_products() { return g_ggml_tiled_q8k.load(); }

bool tile_quantize_matches(int k, uint32_t seed) { return tiles::q8_K_matches(g_q8k.load(), k, seed); }

bool tile_matmul_matches(const std::string & type, int rows, int n, int k, uint32_t seed) {
    for (const TileType & t : g_types) {
        if (type == t.name) return matches(t.type, rows, n, k, seed);
    }
    return false;
}

}  // namespace lmsp
