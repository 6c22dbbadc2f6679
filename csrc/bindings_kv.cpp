#include "bindings_kv.h"

#include <pybind11/stl.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "errors.h"
#include "low_priority.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace lmsp_py {

namespace {

// A contiguous buffer's bytes, held for the call.
class Bytes {
public:
    explicit Bytes(const py::object & source) {
        if (PyObject_GetBuffer(source.ptr(), &view_, PyBUF_C_CONTIGUOUS) != 0) throw py::error_already_set();
    }
    ~Bytes() { PyBuffer_Release(&view_); }
    Bytes(const Bytes &) = delete;
    Bytes & operator=(const Bytes &) = delete;
    const uint8_t * data() const { return static_cast<const uint8_t *>(view_.buf); }
    size_t size() const { return size_t(view_.len); }

private:
    Py_buffer view_{};
};

}  // namespace

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
    if (py::isinstance<KvState>(state)) {
        KvState & held = state.cast<KvState &>();
        if (held.bytes.empty()) throw lmsp::InvalidArgument("prefix.state was handed to the engine already");
        p.state = std::move(held.bytes);
        held.bytes = {};
        return p;
    }
    if (py::isinstance<py::str>(state) || !PyObject_CheckBuffer(state.ptr())) {
        throw py::type_error("prefix.state must be bytes, a buffer or a KvState");
    }
    const Bytes b(state);
    py::gil_scoped_release nogil;
    p.state.assign(b.data(), b.data() + b.size());
    return p;
}

namespace {

// `into` (a bytearray) at `size` bytes at least, its new pages touched without the GIL; its data.
uint8_t * grown(const py::object & into, size_t size) {
    PyObject * a = into.ptr();
    const size_t had = size_t(PyByteArray_GET_SIZE(a));
    if (size > had) {
        if (PyByteArray_Resize(a, py::ssize_t(size)) != 0) throw py::error_already_set();
        char * data = PyByteArray_AS_STRING(a);
        py::gil_scoped_release nogil;
        lmsp::run_low_priority(
            [&] { lmsp::paced(size - had, [&](size_t at, size_t n) { std::memset(data + had + at, 0, n); }); });
    }
    return reinterpret_cast<uint8_t *>(PyByteArray_AS_STRING(a));
}

py::object saved_into(lmsp::Engine & engine, int64_t seq, const py::object & into) {
    const size_t size = engine.saved_prefix_size(seq);
    uint8_t * buffer = size > 0 ? grown(into, size) : nullptr;
    std::optional<lmsp::KvPrefix> p;
    {
        py::gil_scoped_release nogil;
        p = engine.saved_prefix(seq, buffer, buffer != nullptr ? size_t(PyByteArray_GET_SIZE(into.ptr())) : 0);
    }
    if (!p) return py::none();
    size_t n = p->state_size;
    if (n == 0) {  // copied before the request came (a slot reused first): into the buffer now
        n = p->state.size();
        uint8_t * data = grown(into, n);
        py::gil_scoped_release nogil;
        std::memcpy(data, p->state.data(), n);
    }
    py::object whole = py::reinterpret_steal<py::object>(PyMemoryView_FromObject(into.ptr()));
    if (!whole) throw py::error_already_set();
    return py::dict("tokens"_a = py::cast(p->tokens), "tiled_rows"_a = p->tiled_rows, "tiled_min"_a = p->tiled_min,
                    "state"_a = whole[py::slice(0, py::ssize_t(n), 1)]);
}

uint32_t crc32_low(const py::object & source, uint32_t start) {
    const Bytes b(source);
    uint32_t crc = 0;
    py::gil_scoped_release nogil;
    lmsp::run_low_priority([&] {
        crc = start;
        lmsp::paced(b.size(), [&](size_t at, size_t n) { crc = lmsp::crc32(b.data() + at, n, crc); });
    });
    return crc;
}

// All of a buffer written to `fd`, then `fd` synced when asked; OSError on failure.
void write_low(int fd, const py::object & source, bool sync) {
    const Bytes b(source);
    int error = 0;
    {
        py::gil_scoped_release nogil;
        lmsp::run_low_priority([&] {
            lmsp::paced(b.size(), [&](size_t at, size_t n) {
                for (size_t done = 0; done < n && error == 0;) {
                    const ssize_t w = ::write(fd, b.data() + at + done, n - done);
                    if (w > 0) done += size_t(w);
                    if (w < 0 && errno != EINTR) error = errno;
                }
#if defined(__linux__)
                // the disk write of each piece starts now, in its own pace, not all at the fsync
                if (sync && error == 0) sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
#endif
            });
            if (error == 0 && sync && ::fsync(fd) != 0) error = errno;
        });
    }
    if (error != 0) {
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
        throw py::error_already_set();
    }
}

}  // namespace

py::object saved_prefix(lmsp::Engine & engine, int64_t seq, const py::object & into) {
    if (!into.is_none()) {
        if (!PyByteArray_Check(into.ptr())) throw py::type_error("into must be a bytearray or None");
        return saved_into(engine, seq, into);
    }
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

void bind_kv(py::module_ & m) {
    m.def("crc32_low_priority", &crc32_low, "data"_a, "start"_a = 0,
          "zlib's CRC-32 of a buffer, computed on the low-priority thread (csrc/low_priority.h).");
    m.def("write_low_priority", &write_low, "fd"_a, "data"_a, py::kw_only(), "sync"_a = false,
          "Write all of a buffer to a file descriptor (then fsync it with sync=True) on the low-priority thread.");
    m.def("low_priority_nice", &lmsp::low_priority_nice,
          "The low-priority thread's nice value (-100 before its first job, or where threads have none).");
    py::class_<KvState>(m, "KvState")
        .def(py::init([](const py::buffer & source) {
                 const Bytes b(source);
                 auto state = std::make_unique<KvState>();
                 {
                     py::gil_scoped_release nogil;
                     state->bytes.assign(b.data(), b.data() + b.size());
                 }
                 return state;
             }),
             "source"_a)
        .def("__len__", [](const KvState & s) { return s.bytes.size(); });
}

}  // namespace lmsp_py
