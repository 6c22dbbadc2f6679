// The tiled products on x86 (AVX2, AVX-512): a product cut into pieces of
// weight tiles by activation rows, each piece computed by the kernels of
// tile_matmul_kernels.h, for tile_matmul.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ggml.h"

struct ggml_compute_params;

namespace lmsp::x86 {

// Whether this build has tiles for `type` (the kernels of the instruction
// set the compiler targets).
bool has_tiles(ggml_type type);

// What a row's length must be a multiple of: a block, or an f16 tile's step.
int64_t row_multiple(ggml_type type);

// Weight rows [r0, r1) (a multiple of the tile) of a `type` matrix
// (w_row_bytes apart) by `n_act` activation rows quantized to the type's
// vec_dot_type (act_row_bytes apart), `nb` blocks each: dst[a * ld_dst + r],
// each element exactly what ggml's vec_dot gives for one row. One thread.
void product(ggml_type type, const uint8_t * weights, size_t w_row_bytes, int64_t r0, int64_t r1, const uint8_t * act,
             size_t act_row_bytes, int64_t n_act, int nb, float * dst, int64_t ld_dst);

// A thread's share of the product of `w` by the `n` quantized rows of `act`
// (the same elements as product's): pieces taken in turn from ggml's chunk
// counter, which thread 0 set to the number of threads before the barrier
// that precedes the product.
void shared_product(const ggml_compute_params * params, const ggml_tensor * w, const uint8_t * act,
                    size_t act_row_bytes, int64_t n, float * dst, int64_t ld_dst);

}  // namespace lmsp::x86
