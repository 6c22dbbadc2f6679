// Error types of the native core and the llama.cpp log sink.
//
// The engine throws these plain C++ exceptions; bindings.cpp maps each one to
// its Python class (lmsp.native.ModelFormatError and so on).
#pragma once

#include <stdexcept>
#include <string>

namespace lmsp {

// Not GGUF, truncated, corrupt, or an architecture llama.cpp cannot run.
struct ModelFormatError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A prompt (plus resumed tokens) that does not fit one sequence's context.
struct ContextLengthError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Any use of an engine after close().
struct EngineClosedError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A bad argument from the caller (maps to ValueError).
struct InvalidArgument : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

// Any other failure of the native core (maps to lmsp.native.NativeError).
struct NativeFailure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The model file does not exist (maps to FileNotFoundError).
struct FileMissing : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Allocation of model or context memory failed (maps to MemoryError).
struct OutOfMemory : std::runtime_error {
    using std::runtime_error::runtime_error;
};

namespace log {

// Install the sink once; llama.cpp and ggml log through it from then on.
void install();

// Forward llama.cpp's messages to stderr (off by default).
void set_enabled(bool enabled);
bool enabled();

// Error and warning lines logged by the calling thread since the last call to
// begin_capture(); used to give a failed model load a useful message.
void begin_capture();
std::string end_capture();

}  // namespace log
}  // namespace lmsp
