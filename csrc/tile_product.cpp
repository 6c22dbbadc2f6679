// The tiled products on x86: the kernels of tile_matmul_kernels.h put to
// work on a whole product.
//
// A product is cut into pieces: a chunk of 64 activation rows by a range of
// weight tiles. The threads take pieces in turn from ggml's chunk counter, as
// ggml's own matrix products do, so that a thread slowed by something else
// does not keep the others waiting at the next barrier; a thread prepares a
// chunk's activation rows (their scales as floats, what the kernels
// precompute of them) once for all its pieces of that chunk. Within a piece
// the weight tiles are taken in order, two tiles' weights asked for ahead.
// Which rows share a tile or a piece changes no element's bits (each is
// vec_dot's, tile_matmul.cpp).

#include "tile_product.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "ggml-cpu-impl.h"  // ggml/src/ggml-cpu of the pinned source: ggml_compute_params, the chunk counter
#include "ggml-cpu.h"
#include "tile_matmul_kernels.h"

namespace lmsp::x86 {

namespace {

using tiles::ActRows;
using tiles::kTile;
using tiles::TileKernels;
using tiles::WeightRows;

// A type's kernels, or nullptr where this build has none.
const TileKernels * kernels(ggml_type type) {
    if (const TileKernels * k = tiles::kquant_tiles_avx512(type)) return k;
    if (const TileKernels * k = tiles::kquant_tiles(type)) return k;
    if (const TileKernels * k = tiles::f16_tiles(type)) return k;
    if (const TileKernels * k = tiles::legacy_tiles_avx512(type)) return k;
    return tiles::legacy_tiles_avx2(type);
}

// The activations' scales as floats, for the types whose scales are fp16:
// q8_0 (d) and q8_1 (d, and d times the sum).
bool fp16_scales(ggml_type act) { return act == GGML_TYPE_Q8_0 || act == GGML_TYPE_Q8_1; }

float fp16(const uint8_t * p) {
    ggml_fp16_t h;
    std::memcpy(&h, p, sizeof(h));
    return ggml_fp16_to_fp32(h);
}

// The scales (and q8_1's sums) of `n` quantized activation rows as floats,
// four rows side by side per block: d[(g * nb + b) * 4 + i] for row 4g + i
// (zero past the last row).
void act_scales(ggml_type act, const uint8_t * rows, size_t row_bytes, int64_t n, int nb, std::vector<float> & d,
                std::vector<float> & s) {
    const bool q8_1 = act == GGML_TYPE_Q8_1;
    const size_t block = ggml_type_size(act);
    const size_t groups = size_t((n + kTile - 1) / kTile);
    d.assign(groups * size_t(nb) * kTile, 0.0f);
    s.assign(q8_1 ? d.size() : 0, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
        const size_t base = size_t(i / kTile) * size_t(nb) * kTile + size_t(i % kTile);
        for (int b = 0; b < nb; ++b) {
            const uint8_t * blk = rows + size_t(i) * row_bytes + size_t(b) * block;
            d[base + size_t(b) * kTile] = fp16(blk);
            if (q8_1) s[base + size_t(b) * kTile] = fp16(blk + 2);
        }
    }
}

// Asks the memory for the weight tile at `rows` (kTile rows of `row_bytes`,
// one after the other) before the tiles need it. With few activation rows (a
// decode step) a tile computes for less time than its weights take to come
// from memory, and the hardware's own prefetcher runs too short ahead of
// four rows read side by side: the weights of the output matrix then come
// at about half the rate one thread reads memory. The numbers are the same.
inline void prefetch_tile(const uint8_t * rows, size_t row_bytes) {
    constexpr size_t kLine = 64;
    const size_t bytes = kTile * row_bytes;
    for (size_t at = 0; at < bytes; at += kLine) __builtin_prefetch(rows + at, 0, 3);
}

// Weight tiles ahead of the one computed whose weights are asked for.
constexpr int64_t kPrefetchTiles = 2;

// A buffer of at least `floats` floats, 64-byte aligned.
float * aligned(std::vector<float> & buf, size_t floats) {
    constexpr size_t kAlign = 64 / sizeof(float);
    buf.resize(floats + kAlign);
    const auto at = reinterpret_cast<uintptr_t>(buf.data());
    return buf.data() + (((at + 63) & ~uintptr_t(63)) - at) / sizeof(float);
}

constexpr int64_t kActChunk = 64;  // activation rows kept hot in cache across weight tiles

// A chunk of a product's activation rows, [a0, a_end), made ready for the
// tiles: their scales as act_scales writes them (nullptr where the type has
// none) and what prepare_act wrote for each group of four, `group_floats`
// apart (the calling thread's buffers).
struct ActChunk {
    int64_t a0 = -1, a_end = -1;
    const float * d = nullptr;
    const float * s = nullptr;
    const float * groups = nullptr;
    size_t group_floats = 0;
};

// The tile's activation rows a.. of the chunk (up to four). Returns how many
// there are.
int act_rows(const uint8_t * act, size_t act_row_bytes, const ActChunk & c, int64_t a, int nb, ActRows & y) {
    const int n = int(std::min<int64_t>(kTile, c.a_end - a));
    const size_t at = size_t(a - c.a0) * size_t(nb);  // four rows side by side per block
    y = ActRows{};
    for (int i = 0; i < n; ++i) y.q[i] = act + size_t(a + i) * act_row_bytes;
    y.d = c.d != nullptr ? c.d + at : nullptr;
    y.s = c.s != nullptr ? c.s + at : nullptr;
    y.prepared = c.groups + size_t((a - c.a0) / kTile) * c.group_floats;
    return n;
}

// Makes the activation rows [a0, a_end) of `act` ready for `type`'s tiles.
void prepare_chunk(ggml_type type, const uint8_t * act, size_t act_row_bytes, int64_t a0, int64_t a_end, int nb,
                   ActChunk & c) {
    thread_local std::vector<float> scale_d, scale_s, act_prepared;
    const TileKernels & k = *kernels(type);
    const ggml_type act_type = ggml_get_type_traits_cpu(type)->vec_dot_type;
    const bool scales = fp16_scales(act_type);
    if (scales) {
        act_scales(act_type, act + size_t(a0) * act_row_bytes, act_row_bytes, a_end - a0, nb, scale_d, scale_s);
    }
    c.a0 = a0;
    c.a_end = a_end;
    c.d = scales ? scale_d.data() : nullptr;
    c.s = scales && !scale_s.empty() ? scale_s.data() : nullptr;
    c.group_floats = size_t(k.act_floats) * size_t(nb);
    float * groups = aligned(act_prepared, c.group_floats * size_t((a_end - a0 + kTile - 1) / kTile));
    c.groups = groups;
    for (int64_t a = a0; k.prepare_act != nullptr && a < a_end; a += kTile) {
        ActRows y;
        const int n = act_rows(act, act_row_bytes, c, a, nb, y);
        k.prepare_act(y, n, nb, groups + size_t((a - a0) / kTile) * c.group_floats);
    }
}

// Weight rows [r0, r1) (a multiple of the tile) by the chunk's activation
// rows: dst row a, column r. `one_group`: the whole product has one group of
// activation rows, and the type has tiles that take the weights unprepared.
void chunk_product(ggml_type type, const uint8_t * weights, size_t w_row_bytes, int64_t r0, int64_t r1,
                   const uint8_t * act, size_t act_row_bytes, const ActChunk & c, int nb, bool one_group, float * dst,
                   int64_t ld_dst) {
    thread_local std::vector<float> prepared;
    const TileKernels & k = *kernels(type);
    float * w_prep = aligned(prepared, size_t(k.floats) * size_t(nb));
    for (int64_t r = r0; r < r1; r += kTile) {
        if (r + kPrefetchTiles * kTile < r1) {
            prefetch_tile(weights + size_t(r + kPrefetchTiles * kTile) * w_row_bytes, w_row_bytes);
        }
        WeightRows w{};
        for (int j = 0; j < kTile; ++j) w.w[j] = weights + size_t(r + j) * w_row_bytes;
        if (k.prepare != nullptr && !one_group) {
            k.prepare(w.w, nb, w_prep);
            w.prepared = w_prep;
        }
        for (int64_t a = c.a0; a < c.a_end; a += kTile) {
            ActRows y;
            const int n = act_rows(act, act_row_bytes, c, a, nb, y);
            (one_group ? k.one_group : k.tile)[n - 1](w, y, nb, dst + a * ld_dst + r, ld_dst);
        }
    }
}

bool one_group(ggml_type type, int64_t n_act) { return n_act <= kTile && kernels(type)->one_group[0] != nullptr; }

// Pieces of a product per thread: a chunk of activation rows by a range of
// weight tiles each.
constexpr int64_t kPiecesPerThread = 4;

}  // namespace

bool has_tiles(ggml_type type) { return kernels(type) != nullptr; }

int64_t row_multiple(ggml_type type) {
    return type == GGML_TYPE_F16 ? tiles::f16_row_multiple() : ggml_blck_size(type);
}

void product(ggml_type type, const uint8_t * weights, size_t w_row_bytes, int64_t r0, int64_t r1, const uint8_t * act,
             size_t act_row_bytes, int64_t n_act, int nb, float * dst, int64_t ld_dst) {
    const bool one = one_group(type, n_act);
    ActChunk c;
    for (int64_t a0 = 0; a0 < n_act; a0 += kActChunk) {
        prepare_chunk(type, act, act_row_bytes, a0, std::min(n_act, a0 + kActChunk), nb, c);
        chunk_product(type, weights, w_row_bytes, r0, r1, act, act_row_bytes, c, nb, one, dst, ld_dst);
    }
}

void shared_product(const ggml_compute_params * params, const ggml_tensor * w, const uint8_t * act,
                    size_t act_row_bytes, int64_t n, float * dst, int64_t ld_dst) {
    const int64_t tiles = w->ne[1] / kTile;
    const int64_t ranges = std::min<int64_t>(tiles, int64_t(params->nth) * kPiecesPerThread);
    const int64_t pieces = (n + kActChunk - 1) / kActChunk * ranges;
    const int nb = int(w->ne[0] / ggml_blck_size(w->type));
    const auto * weights = static_cast<const uint8_t *>(w->data);
    const bool one = one_group(w->type, n);
    ActChunk c;
    for (int64_t piece = params->ith; piece < pieces; piece = ggml_threadpool_chunk_add(params->threadpool, 1)) {
        const int64_t a0 = piece / ranges * kActChunk, g = piece % ranges;
        if (c.a0 != a0) prepare_chunk(w->type, act, act_row_bytes, a0, std::min(n, a0 + kActChunk), nb, c);
        chunk_product(w->type, weights, w->nb[1], tiles * g / ranges * kTile, tiles * (g + 1) / ranges * kTile, act,
                      act_row_bytes, c, nb, one, dst, ld_dst);
    }
}

}  // namespace lmsp::x86
