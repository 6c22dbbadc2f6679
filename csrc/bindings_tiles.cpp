#include "bindings_tiles.h"

#include <pybind11/stl.h>

#include "tile_matmul.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace lmsp_py {

void bind_tiles(py::module_ & m) {
    m.def("tile_matmul_types", &lmsp::tile_matmul_types,
          "The weight types whose products of several rows take the tiled kernels (tile_matmul.cpp).");
    m.def("tile_matmul_products", &lmsp::tile_matmul_products, "Matrix products the tiles computed so far.");
    m.attr("TILE_MATMUL_BUILT") = lmsp::tile_matmul_built();
    m.attr("TILE_MATMUL_KQUANTS_FIRST") = lmsp::tile_matmul_kquants_first();
    m.def("set_tile_matmul", &lmsp::set_tile_matmul, "on"_a,
          "Tiled products on or off for the whole process, while no engine computes (the same numbers either way).");
    m.def("tile_quantize_q8_K", &lmsp::tile_quantize_q8_K,
          "Whether the hook quantizes the K-quants' activations with its own code (same bytes as ggml's).");
    m.def("tile_quantize_ggml_tiled_products", &lmsp::tile_quantize_ggml_tiled_products,
          "Products of ggml's tiled K-quant matmul that took their activations from that code so far.");
    m.def("tile_quantize_matches", &lmsp::tile_quantize_matches, "k"_a, "seed"_a,
          "Whether that code's q8_K of k random and edge-case floats is ggml's byte for byte.");
    m.def("tile_matmul_matches", &lmsp::tile_matmul_matches, "type"_a, "rows"_a, "n"_a, "k"_a, "seed"_a,
          "Whether the tiled product of random weights equals ggml's one-row dot product bit for bit.");
}

}  // namespace lmsp_py
