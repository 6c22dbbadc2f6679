// Matrix products of several rows in register tiles, with ggml-cpu's own
// one-row arithmetic for every element (tile_matmul.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lmsp {

// Puts the tiled products into ggml's CPU backend, once per process. Each
// weight type is taken only where a check against ggml's own dot product
// gives the same bits; none in a build for a CPU without AVX2 or, on ARM,
// without the dot-product extension.
void install_tile_matmul();

// The weight types the tiled products take now ("q4_1", "q5_0", "q8_0", "q4_K",
// "q6_K"); empty when off or not installed.
std::vector<std::string> tile_matmul_types();

// Off or on again, for the whole process (a benchmark's or a test's control
// case), while no engine computes: a product whose threads saw different
// settings would be computed wrong. The numbers are the same either way.
void set_tile_matmul(bool on);

// Matrix products the tiles computed in this process so far.
int64_t tile_matmul_products();

// Whether this build has the tiles: the compiler targets AVX2 (with or
// without AVX-VNNI) or AVX-512 VNNI (tile_matmul_kernels.h), or ARM NEON with
// the dot-product extension (tile_matmul_neon.h).
bool tile_matmul_built();

// Whether the tiles take every q4_K and q6_K product of two rows or more,
// those ggml's tiled K-quant matmul would take included (ARM, and x86
// without AVX-512 VNNI): such products have vec_dot's bits whatever the rows.
bool tile_matmul_kquants_first();

// Whether the hook quantizes the K-quants' activations (q8_K) with its own
// code (tile_quantize.cpp) rather than ggml's reference code: same bytes,
// checked at install.
bool tile_quantize_q8_K();

// Products of ggml's tiled K-quant matmul (AVX-512 VNNI, 8 rows or more)
// that took their activations from that code, in this process so far.
int64_t tile_quantize_ggml_tiled_products();

// Whether that code's q8_K of `k` floats (a multiple of 256, random and
// edge-case blocks) is ggml's byte for byte. False where the hook does not
// use it (not built, not installed, or its check at install failed).
bool tile_quantize_matches(int k, uint32_t seed);

// Whether the tiled product of random `type` weights (`rows` x `k`) and `n`
// random activation rows equals ggml's one-row dot product (vec_dot) bit for
// bit in every element. False for a type the tiles do not take.
bool tile_matmul_matches(const std::string & type, int rows, int n, int k, uint32_t seed);

}  // namespace lmsp
