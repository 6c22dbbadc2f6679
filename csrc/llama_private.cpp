#include "llama_private.h"

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "llama-context.h"  // llama_context::get_sched(): src/ of the pinned llama.cpp
#include "llama-grammar.h"  // llama_grammar_init_impl without a vocabulary

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

}  // namespace lmsp
