// Writing a model's weights again in another type, with llama.cpp's quantizer.
#pragma once

#include <string>
#include <vector>

namespace lmsp {

// The types quantize() takes, by name ("q4_k_m", "q8_0", ...), in a stable order.
std::vector<std::string> quantize_types();

// Writes `src` (a GGUF model) to `dst` with its matrices in `type`, on
// `n_threads` threads (0: one per core). Checks `src` as the engine does
// before llama.cpp reads it. Throws FileMissing, ModelFormatError,
// InvalidArgument (an unknown type, dst the same file as src, src already
// quantized) or NativeFailure (llama.cpp could not write the file). dst
// appears only once complete.
void quantize(const std::string & src, const std::string & dst, const std::string & type, int n_threads);

}  // namespace lmsp
