// The tiled matrix products' controls and checks on the module (tile_matmul.h).
#pragma once

#include <pybind11/pybind11.h>

namespace lmsp_py {

// tile_matmul_types, tile_matmul_products, set_tile_matmul,
// tile_matmul_matches, TILE_MATMUL_BUILT and TILE_MATMUL_KQUANTS_FIRST.
void bind_tiles(pybind11::module_ & m);

}  // namespace lmsp_py
