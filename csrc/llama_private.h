// What the engine takes from llama.cpp beyond its public API (llama.h), each
// through llama.cpp's own internal headers of the pinned source.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

struct llama_context;
struct llama_model;

namespace lmsp {

// Puts the context's CPU backend on ggml's reference kernels, or takes it
// off them, for the graphs computed from then on
// (ggml_backend_cpu_set_use_ref): with them every matmul, whatever the
// number of rows, takes the one-row dot product, and flash attention its
// per-row kernel, with no fusion of ops. (llama.cpp gives every context a
// CPU backend.)
void use_reference_cpu_kernels(llama_context * ctx, bool on);

// Whether llama.cpp's grammar sampler would take this GBNF text (start rule
// "root"): it parses, every rule is defined, none is left-recursive. No
// vocabulary needed (the text names no tokens).
bool grammar_parses(const char * gbnf);

// The device of each of the model's layers, the output layer last: "cpu", or
// the description of the device (an RPC server's HOST:PORT).
std::vector<std::string> model_layer_places(const llama_model * model);

// The buffers in this process's memory (a CPU device's) that hold the model's
// weights, each once: (base, size).
std::vector<std::pair<void *, size_t>> model_cpu_buffers(const llama_model * model);

}  // namespace lmsp
