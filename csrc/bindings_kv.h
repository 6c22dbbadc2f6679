// The KV prefixes of the Python-facing engine (bindings.cpp): a prefix given
// with a submission, and a saved one handed out with its state in a bytes
// object made for it.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

#include "engine.h"

namespace lmsp_py {

// A KV state copied out of a buffer (a KV file's bytes) ahead of a submission,
// without the GIL; a prefix whose "state" is one hands it over to the engine
// without a copy (once: it is empty after).
struct KvState {
    std::vector<uint8_t> bytes;
};

// KvState as the module's class.
void bind_kv(pybind11::module_ & m);

// {"tokens": [int], "tiled_rows": int, "tiled_min": int, "state": bytes or
// another buffer}; the state copied without the GIL.
lmsp::KvPrefix as_prefix(const pybind11::handle & value);

// Engine::saved_prefix as that dict (None when nothing waits): the engine
// thread copies the state into a bytes object whose pages this thread touched,
// or, with `into` (a bytearray the caller keeps for this, used by one thread),
// into that, grown as needed; "state" is then a memoryview of its first bytes
// (the bytearray cannot be resized while it lives). Only the engine thread's
// copy, made between two steps, and the touching of new pages take time, both
// without the GIL.
pybind11::object saved_prefix(lmsp::Engine & engine, int64_t seq, const pybind11::object & into);

}  // namespace lmsp_py
