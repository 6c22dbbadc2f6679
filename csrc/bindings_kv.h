// The KV prefixes of the Python-facing engine (bindings.cpp): a prefix given
// with a submission, and a saved one handed out with its state in a bytes
// object made for it.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

#include "engine.h"

namespace lmsp_py {

// {"tokens": [int], "tiled_rows": int, "tiled_min": int, "state": bytes}; the
// state copied without the GIL.
lmsp::KvPrefix as_prefix(const pybind11::handle & value);

// Engine::saved_prefix as that dict (None when nothing waits): the engine
// thread copies the state into a bytes object whose pages this thread touched.
pybind11::object saved_prefix(lmsp::Engine & engine, int64_t seq);

}  // namespace lmsp_py
