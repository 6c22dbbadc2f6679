// The tiled products on ARM: NEON with the dot-product extension
// (tile_matmul_neon.cpp), for tile_matmul.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ggml.h"

namespace lmsp::neon {

// Weight rows [r0, r1) (a multiple of 4) of a q4_1, q5_0, q8_0, q4_K or q6_K
// matrix (w_row_bytes apart) by `n_act` activation rows quantized to the
// type's vec_dot_type (act_row_bytes apart), `nb` blocks of the type each (32
// values; 256 for q4_K and q6_K): dst[a * ld_dst + r], each element exactly
// what ggml's aarch64 vec_dot gives for one row.
void product(ggml_type type, const uint8_t * weights, size_t w_row_bytes, int64_t r0, int64_t r1, const uint8_t * act,
             size_t act_row_bytes, int64_t n_act, int nb, float * dst, int64_t ld_dst);

}  // namespace lmsp::neon
