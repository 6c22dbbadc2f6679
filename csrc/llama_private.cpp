#include "llama_private.h"

#include <algorithm>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "llama-context.h"  // llama_context::get_sched(): src/ of the pinned llama.cpp
#include "llama-grammar.h"  // llama_grammar_init_impl without a vocabulary
#include "llama-model.h"    // llama_model::dev_layer
#include "rpc_relay.h"

namespace lmsp {

void use_reference_cpu_kernels(llama_context * ctx, bool on) {
    ggml_backend_sched_t sched = ctx->get_sched();
    for (int i = 0; i < ggml_backend_sched_get_n_backends(sched); ++i) {
        ggml_backend_t backend = ggml_backend_sched_get_backend(sched, i);
        if (ggml_backend_is_cpu(backend)) ggml_backend_cpu_set_use_ref(backend, on);
    }
}

bool grammar_parses(const char * gbnf) {
    llama_grammar * g = llama_grammar_init_impl(nullptr, gbnf, "root", false, nullptr, 0, nullptr, 0);
    if (g == nullptr) return false;
    llama_grammar_free_impl(g);
    return true;
}

std::vector<std::string> model_layer_places(const llama_model * model) {
    std::vector<std::string> out;
    auto place = [](ggml_backend_dev_t dev) -> std::string {
        if (dev == nullptr || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) return "cpu";
        return rpc_server_of(ggml_backend_dev_description(dev));  // the server, not its relay
    };
    for (int32_t il = 0; il < int32_t(model->hparams.n_layer()); ++il) out.push_back(place(model->dev_layer(il)));
    // the output matrix's own buffer: a split model keeps it here (rpc.cpp)
    const ggml_tensor * output = model->output;
    const bool here = output != nullptr && output->buffer != nullptr && ggml_backend_buffer_is_host(output->buffer);
    out.push_back(here ? "cpu" : place(model->dev_output()));
    return out;
}

std::vector<std::pair<void *, size_t>> model_cpu_buffers(const llama_model * model) {
    std::vector<std::pair<void *, size_t>> out;
    std::vector<ggml_backend_buffer_t> seen;
    for (const auto & named : model->tensors_by_name) {
        ggml_backend_buffer_t buf = named.second->buffer;
        if (buf == nullptr || std::find(seen.begin(), seen.end(), buf) != seen.end()) continue;
        seen.push_back(buf);
        // ggml's plain CPU buffer type names no device; its repacking one the CPU
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(buf));
        const bool cpu = dev == nullptr ? ggml_backend_buffer_is_host(buf)
                                        : ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU;
        if (!cpu) continue;
        out.emplace_back(ggml_backend_buffer_get_base(buf), ggml_backend_buffer_get_size(buf));
    }
    return out;
}

}  // namespace lmsp
