#include <pybind11/pybind11.h>

#include "llama.h"

namespace py = pybind11;

PYBIND11_MODULE(_native, m) {
    m.doc() = "lmsp native core: llama.cpp engine";
    m.attr("__version__") = LMSP_VERSION;
    m.def("system_info", [] { return std::string(llama_print_system_info()); });
}
