// Embeddings of token sequences: a llama context of its own over the engine's
// model, pooled by the model's pooling type (mean where the model declares
// none), each vector normalized to length 1.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "llama.h"

namespace lmsp {

class Embedder {
public:
    // n_ctx: the longest input; n_threads: CPU threads of its passes
    Embedder(llama_model * model, int32_t n_ctx, int32_t n_threads);
    ~Embedder();
    Embedder(const Embedder &) = delete;
    Embedder & operator=(const Embedder &) = delete;

    // One vector per input, in order; inputs are batched, many to a pass.
    std::vector<std::vector<float>> embed(const std::vector<std::vector<int32_t>> & inputs);
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

    mutable std::mutex mu_;  // one pass at a time
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
