#include "bindings_rpc.h"

#include <string>

#include "rpc.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace lmsp_py {

namespace {
PyObject * g_rpc_unreachable = nullptr;
PyObject * g_backend_lost = nullptr;
}  // namespace

void bind_rpc(py::module_ & m, PyObject * native_error) {
    py::tuple bases = py::make_tuple(py::handle(native_error), py::handle(PyExc_ConnectionError));
    g_rpc_unreachable = PyErr_NewExceptionWithDoc("lmsp._native.RpcUnreachableError",
                                                  "An RPC server does not answer, or speaks another protocol version.",
                                                  bases.ptr(), nullptr);
    if (g_rpc_unreachable == nullptr) throw py::error_already_set();
    Py_INCREF(g_rpc_unreachable);  // the module holds one reference, the translator another
    m.add_object("RpcUnreachableError", py::reinterpret_borrow<py::object>(g_rpc_unreachable));
    g_backend_lost = PyErr_NewExceptionWithDoc(
        "lmsp._native.BackendLostError",
        "An RPC server a model is split over was lost while it ran; the message names its address.", bases.ptr(),
        nullptr);
    if (g_backend_lost == nullptr) throw py::error_already_set();
    Py_INCREF(g_backend_lost);
    m.add_object("BackendLostError", py::reinterpret_borrow<py::object>(g_backend_lost));
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const lmsp::RpcUnreachable & e) {
            PyErr_SetString(g_rpc_unreachable, e.what());
        } catch (const lmsp::BackendLost & e) {
            PyErr_SetString(g_backend_lost, e.what());
        }
    });

    m.attr("RPC_BUILT") = lmsp::rpc_built();
    m.attr("BACKEND_LOST") = lmsp::kBackendLost;
    m.def("rpc_protocol", &lmsp::rpc_protocol, "The RPC protocol version this build speaks (empty: none).");
    m.def("rpc_hello", &lmsp::rpc_hello, "endpoint"_a, "timeout_ms"_a = 5000,
          "Greets the RPC server at HOST:PORT; its protocol version, or RpcUnreachableError.",
          py::call_guard<py::gil_scoped_release>());
    m.def("rpc_serve", &lmsp::rpc_serve, "endpoint"_a, py::kw_only(), "cache_dir"_a = "", "n_threads"_a = 1,
          "mem_bytes"_a = 0,
          "Serves this box's CPU to RPC clients on HOST:PORT, with the engine's kernels; returns only by raising.",
          py::call_guard<py::gil_scoped_release>());
}

}  // namespace lmsp_py
