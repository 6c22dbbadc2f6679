// Embeddings of token sequences: a llama context of its own over the engine's
// model, pooled by the model's pooling type (mean where the model declares
// none), each vector normalized to length 1.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ggml-cpu.h"
#include "llama.h"

namespace lmsp {

// Takes llama.cpp's output layer out of an embeddings pass. llama.cpp builds
// it into every graph of a decoder (n_vocab logits a row) though a pooled
// vector needs none of it. ggml_backend_sched asks the eval callback about
// each node of a graph before it computes any (the answer, "no need to look",
// lets the graph compute in one go); once it has seen both the logits
// ("result_output") and the pooled vectors ("result_embd_pooled"), it takes
// ggml's compute flag off every node that only the logits need. Only where
// the CPU is the one backend (the embedder installs it there alone): between
// backends the scheduler computes a graph in several splits and puts copies
// in the nodes' sources, where what the pooled vectors need no longer shows.
class OutputLayerSkip {
public:
    static bool on_node(ggml_tensor * t, bool ask, void * self);
    void begin_pass() { logits_ = pooled_ = nullptr; }
    int64_t passes() const { return passes_; }  // passes without the output layer so far

private:
    void skip_what_only_logits_need();

    ggml_tensor * logits_ = nullptr;
    ggml_tensor * pooled_ = nullptr;
    int64_t passes_ = 0;
};

// What embed() did: its passes, and how many of them went without the output layer.
struct EmbedCounts {
    int64_t passes = 0;
    int64_t passes_without_logits = 0;
};

class Embedder {
public:
    // n_ctx: the longest input; n_threads: CPU threads of its passes
    Embedder(llama_model * model, int32_t n_ctx, int32_t n_threads);
    ~Embedder();
    Embedder(const Embedder &) = delete;
    Embedder & operator=(const Embedder &) = delete;

    // One vector per input, in order; inputs are batched, many to a pass.
    std::vector<std::vector<float>> embed(const std::vector<std::vector<int32_t>> & inputs, EmbedCounts & counts);
    int32_t n_embd() const { return n_embd_; }
    // a pass was longer than the usual ones (one long input): its buffers are that large
    bool oversized() const;

private:
    void make_context(llama_model * model, int32_t n_threads, enum llama_pooling_type pooling);
    void run_pass(const std::vector<std::vector<int32_t>> & inputs, const std::vector<size_t> & which,
                  std::vector<std::vector<float>> & out);

    struct ContextDeleter {
        void operator()(llama_context * c) const { llama_free(c); }
    };
    struct ThreadpoolDeleter {
        void operator()(ggml_threadpool * t) const { ggml_threadpool_free(t); }
    };

    mutable std::mutex mu_;  // one pass at a time
    // its own CPU threads, kept from pass to pass (without one, ggml starts
    // and joins threads for every graph); freed after the context
    std::unique_ptr<ggml_threadpool, ThreadpoolDeleter> threadpool_;
    OutputLayerSkip skip_;
    std::unique_ptr<llama_context, ContextDeleter> ctx_;
    llama_batch batch_{};
    bool batch_allocated_ = false;
    int32_t n_ctx_ = 0;
    int32_t n_seq_ = 0;
    int32_t n_embd_ = 0;
    int64_t largest_pass_ = 0;  // rows of the largest pass so far
    enum llama_pooling_type pooling_ = LLAMA_POOLING_TYPE_MEAN;
};

}  // namespace lmsp
