#include "bindings_kv.h"

#include <pybind11/stl.h>

#include <climits>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "errors.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace lmsp_py {

namespace {

int32_t count_of(const py::dict & d, const char * key) {
    if (!d.contains(key)) return 0;
    py::object v = d[key];
    if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) {
        throw py::type_error(std::string("prefix.") + key + " must be an int");
    }
    const long long x = v.cast<long long>();
    if (x < 0 || x > INT32_MAX) throw lmsp::InvalidArgument(std::string("prefix.") + key + " is out of range");
    return int32_t(x);
}

// A new bytes object of `size` bytes, its pages touched (or filled from `from`) without the GIL.
py::object new_bytes(size_t size, const std::vector<uint8_t> * from = nullptr) {
    py::object b = py::reinterpret_steal<py::object>(PyBytes_FromStringAndSize(nullptr, py::ssize_t(size)));
    if (!b) throw py::error_already_set();
    char * data = PyBytes_AS_STRING(b.ptr());
    py::gil_scoped_release nogil;
    if (from != nullptr) {
        std::memcpy(data, from->data(), size);
    } else {
        std::memset(data, 0, size);
    }
    return b;
}

}  // namespace

lmsp::KvPrefix as_prefix(const py::handle & value) {
    if (!py::isinstance<py::dict>(value)) throw py::type_error("prefix must be a dict or None");
    py::dict d = py::reinterpret_borrow<py::dict>(value);
    if (!d.contains("tokens") || !d.contains("state")) throw lmsp::InvalidArgument("prefix needs 'tokens' and 'state'");
    py::object tokens = d["tokens"];
    if (py::isinstance<py::str>(tokens) || py::isinstance<py::bytes>(tokens)) {
        throw py::type_error("prefix.tokens must be a list of token ids");
    }
    lmsp::KvPrefix p;
    for (const py::handle t : py::iter(tokens)) {
        if (!py::isinstance<py::int_>(t) || py::isinstance<py::bool_>(t)) {
            throw py::type_error("prefix.tokens must be a list of token ids");
        }
        const long long x = t.cast<long long>();
        if (x < INT32_MIN || x > INT32_MAX) throw lmsp::InvalidArgument("prefix.tokens is out of range");
        p.tokens.push_back(int32_t(x));
    }
    p.tiled_rows = size_t(count_of(d, "tiled_rows"));
    p.tiled_min = size_t(count_of(d, "tiled_min"));
    py::object state = d["state"];
    if (!py::isinstance<py::bytes>(state)) throw py::type_error("prefix.state must be bytes");
    const char * data = PyBytes_AS_STRING(state.ptr());
    const size_t size = size_t(PyBytes_GET_SIZE(state.ptr()));
    py::gil_scoped_release nogil;
    p.state.assign(data, data + size);
    return p;
}

py::object saved_prefix(lmsp::Engine & engine, int64_t seq) {
    const size_t size = engine.saved_prefix_size(seq);
    py::object state = size > 0 ? new_bytes(size) : py::object(py::none());
    auto * buffer = size > 0 ? reinterpret_cast<uint8_t *>(PyBytes_AS_STRING(state.ptr())) : nullptr;
    std::optional<lmsp::KvPrefix> p;
    {
        py::gil_scoped_release nogil;
        p = engine.saved_prefix(seq, buffer, size);
    }
    if (!p) return py::none();
    if (p->state_size == 0) {
        state = new_bytes(p->state.size(), &p->state);
    } else if (p->state_size < size) {
        PyObject * shrunk = state.release().ptr();
        if (_PyBytes_Resize(&shrunk, py::ssize_t(p->state_size)) != 0) throw py::error_already_set();
        state = py::reinterpret_steal<py::object>(shrunk);
    }
    return py::dict("tokens"_a = py::cast(p->tokens), "tiled_rows"_a = p->tiled_rows, "tiled_min"_a = p->tiled_min,
                    "state"_a = state);
}

}  // namespace lmsp_py
