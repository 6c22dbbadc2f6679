// Embeddings (see embedder.h), and the engine's call that makes its embedder
// on first use.
#include "embedder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <unordered_set>

#include "batch_plan.h"
#include "engine.h"
#include "errors.h"
#include "ggml-backend.h"
#include "llama_private.h"
#include "rpc.h"

namespace lmsp {

namespace {
constexpr int32_t kMaxSequencesPerPass = 64;
// Passes hold at most this many rows, llama-server's default batch (an input
// longer than that passes alone): llama.cpp copies n_vocab floats a row out of
// every embeddings pass (the logits, left uncomputed here: OutputLayerSkip)
// into a buffer it keeps at the size of the largest pass.
constexpr int64_t kPassRows = 512;

void push_sources(const ggml_tensor * t, std::vector<ggml_tensor *> & stack) {
    for (ggml_tensor * src : t->src) {
        if (src != nullptr) stack.push_back(src);
    }
    if (t->view_src != nullptr) stack.push_back(t->view_src);
}
}  // namespace

bool OutputLayerSkip::on_node(ggml_tensor * t, bool ask, void * self) {
    auto * skip = static_cast<OutputLayerSkip *>(self);
    if (!ask) return true;  // never asked to look at a node: go on
    const char * name = ggml_get_name(t);
    if (std::strcmp(name, "result_output") == 0) {
        skip->logits_ = t;
    } else if (std::strcmp(name, "result_embd_pooled") == 0) {
        skip->pooled_ = t;
    } else {
        return false;
    }
    if (skip->logits_ != nullptr && skip->pooled_ != nullptr) {
        skip->skip_what_only_logits_need();
        if ((skip->logits_->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) ++skip->passes_;
        skip->begin_pass();
    }
    return false;
}

void OutputLayerSkip::skip_what_only_logits_need() {
    if ((logits_->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) return;  // a graph used again: done already
    std::unordered_set<const ggml_tensor *> needed;                // the pooled vectors and all they need
    std::vector<ggml_tensor *> stack{pooled_};
    while (!stack.empty()) {
        ggml_tensor * t = stack.back();
        stack.pop_back();
        if (needed.insert(t).second) push_sources(t, stack);
    }
    // the rest of what the logits need; their weights and other leaves (no op) stay as they are
    std::unordered_set<const ggml_tensor *> seen;
    stack.assign(1, logits_);
    while (!stack.empty()) {
        ggml_tensor * t = stack.back();
        stack.pop_back();
        if (needed.count(t) != 0 || !seen.insert(t).second) continue;
        if (t->op != GGML_OP_NONE) t->flags &= ~int32_t(GGML_TENSOR_FLAG_COMPUTE);
        push_sources(t, stack);
    }
}

Embedder::Embedder(llama_model * model, int32_t n_ctx, int32_t n_threads) : n_ctx_(n_ctx) {
    n_seq_ = std::min<int32_t>(kMaxSequencesPerPass, int32_t(llama_max_parallel_sequences()));
    ggml_threadpool_params tpp = ggml_threadpool_params_default(n_threads);
    tpp.poll = 0;  // between passes and after the last one, its threads sleep instead of spinning
    threadpool_.reset(ggml_threadpool_new(&tpp));
    if (!threadpool_) throw NativeFailure("cannot start " + std::to_string(n_threads) + " CPU threads");
    // the model's own pooling where its file declares one; mean otherwise
    make_context(model, n_threads, LLAMA_POOLING_TYPE_UNSPECIFIED);
    if (llama_pooling_type(ctx_.get()) == LLAMA_POOLING_TYPE_NONE) {
        make_context(model, n_threads, LLAMA_POOLING_TYPE_MEAN);
    }
    pooling_ = llama_pooling_type(ctx_.get());
    if (pooling_ == LLAMA_POOLING_TYPE_RANK) {
        throw InvalidArgument("the model ranks pairs of texts (a reranker); it makes no embeddings");
    }
    n_embd_ = llama_model_n_embd(model);
    batch_ = llama_batch_init(n_ctx_, 0, 1);
    batch_allocated_ = true;
}

Embedder::~Embedder() {
    if (batch_allocated_) llama_batch_free(batch_);
}

void Embedder::make_context(llama_model * model, int32_t n_threads, enum llama_pooling_type pooling) {
    llama_context_params cp = llama_context_default_params();
    // one pass holds whole inputs (pooling needs each input in one micro-batch)
    cp.n_ctx = uint32_t(n_ctx_);
    cp.n_batch = uint32_t(n_ctx_);
    cp.n_ubatch = uint32_t(n_ctx_);
    cp.n_seq_max = uint32_t(n_seq_);
    cp.kv_unified = true;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.embeddings = true;
    cp.pooling_type = pooling;
    cp.no_perf = true;
    if (ggml_backend_dev_count() == 1) {  // the CPU alone: one backend, one split of each graph
        cp.cb_eval = &OutputLayerSkip::on_node;
        cp.cb_eval_user_data = &skip_;
    }
    ctx_.reset();
    ctx_.reset(llama_init_from_model(model, cp));
    if (!ctx_) throw NativeFailure("cannot create the embeddings context of " + std::to_string(n_ctx_) + " tokens");
    llama_attach_threadpool(ctx_.get(), threadpool_.get(), threadpool_.get());
}

bool Embedder::oversized() const {
    std::lock_guard<std::mutex> lk(mu_);
    return largest_pass_ > kPassRows;
}

std::vector<std::vector<float>> Embedder::embed(const std::vector<std::vector<int32_t>> & inputs,
                                                EmbedCounts & counts) {
    for (const auto & input : inputs) {
        if (input.empty()) throw InvalidArgument("an input to embed must have at least one token");
        if (int64_t(input.size()) > n_ctx_) {
            throw ContextLengthError("an input of " + std::to_string(input.size()) + " tokens is longer than the " +
                                     std::to_string(n_ctx_) + " tokens of the context");
        }
    }
    std::lock_guard<std::mutex> lk(mu_);
    const int64_t without_logits = skip_.passes();
    std::vector<std::vector<float>> out(inputs.size());
    // An input's vector is the one it gets alone, as llama-server computes it. ggml
    // picks its kernels by the rows of a pass: inputs shorter than its tiled matmul
    // takes pass together on the one-row kernels (which they take alone); inputs
    // shorter than its tiled flash attention takes, in passes of fewer rows than that;
    // longer ones together (tiles give each row the same however many rows come).
    struct Group {
        std::vector<size_t> members;
        bool reference;
        int64_t max_rows;
    };
    Group groups[3] = {{{}, true, kPassRows}, {{}, false, int64_t(kFaTileRows) - 1}, {{}, false, kPassRows}};
    for (size_t i = 0; i < inputs.size(); ++i) {
        const size_t n = inputs[i].size();
        groups[n < kMinTiledRows ? 0 : n < kFaTileRows ? 1 : 2].members.push_back(i);
    }
    for (const Group & group : groups) {
        use_reference_cpu_kernels(ctx_.get(), group.reference);
        const auto & m = group.members;
        size_t first = 0;
        while (first < m.size()) {
            size_t count = 0;
            int64_t used = 0;
            const int64_t rows = std::max(group.max_rows, int64_t(inputs[m[first]].size()));
            while (first + count < m.size() && int32_t(count) < n_seq_ &&
                   used + int64_t(inputs[m[first + count]].size()) <= rows) {
                used += int64_t(inputs[m[first + count]].size());
                ++count;
            }
            run_pass(inputs, std::vector<size_t>(m.begin() + first, m.begin() + first + count), out);
            largest_pass_ = std::max(largest_pass_, used);
            first += count;
            ++counts.passes;
        }
    }
    counts.passes_without_logits += skip_.passes() - without_logits;
    return out;
}

void Embedder::run_pass(const std::vector<std::vector<int32_t>> & inputs, const std::vector<size_t> & which,
                        std::vector<std::vector<float>> & out) {
    batch_.n_tokens = 0;
    for (size_t k = 0; k < which.size(); ++k) {
        const auto & input = inputs[which[k]];
        for (size_t pos = 0; pos < input.size(); ++pos) {
            const int32_t i = batch_.n_tokens++;
            batch_.token[i] = input[pos];
            batch_.pos[i] = int32_t(pos);
            batch_.n_seq_id[i] = 1;
            batch_.seq_id[i][0] = int32_t(k);
            batch_.logits[i] = 1;
        }
    }
    llama_memory_clear(llama_get_memory(ctx_.get()), true);
    skip_.begin_pass();
    if (llama_decode(ctx_.get(), batch_) != 0) throw NativeFailure("the embeddings pass failed");
    for (size_t k = 0; k < which.size(); ++k) {
        const float * e = llama_get_embeddings_seq(ctx_.get(), int32_t(k));
        if (e == nullptr) throw NativeFailure("the embeddings pass gave no vector");
        std::vector<float> v(e, e + n_embd_);
        double norm = 0;
        for (float x : v) norm += double(x) * double(x);
        norm = std::sqrt(norm);
        if (norm > 0) {
            for (float & x : v) x = float(double(x) / norm);
        }
        out[which[k]] = std::move(v);
    }
}

std::vector<std::vector<float>> Engine::embed(const std::vector<std::vector<int32_t>> & inputs) {
    check_open();
    for (const auto & input : inputs) check_tokens(input, "embed");
    std::shared_ptr<Embedder> embedder;
    {
        std::lock_guard<std::mutex> lk(embedder_mu_);
        check_open();
        if (!embedder_) {
            const int32_t n_threads = options_.n_threads > 0
                                          ? options_.n_threads
                                          : int32_t(std::max(1u, std::thread::hardware_concurrency()));
            embedder_ = std::make_shared<Embedder>(model_.get(), n_ctx_, n_threads);
        }
        embedder = embedder_;
    }
    EmbedCounts counts;
    std::vector<std::vector<float>> out = embedder->embed(inputs, counts);
    throw_if_lost();  // what a lost server's relay answered is not the model's
    embed_passes_ += counts.passes;
    embed_passes_without_logits_ += counts.passes_without_logits;
    if (embedder->oversized()) {
        // a pass of one long input grew its buffers: free them (a pass under way keeps its own)
        std::lock_guard<std::mutex> lk(embedder_mu_);
        if (embedder_ == embedder) embedder_.reset();
    }
    return out;
}

void Engine::close_embedder() {
    std::lock_guard<std::mutex> lk(embedder_mu_);
    embedder_.reset();  // a pass under way keeps its own reference to the end
}

std::vector<int32_t> Engine::fim_tokens() const {
    const llama_token pre = llama_vocab_fim_pre(vocab_), suf = llama_vocab_fim_suf(vocab_),
                      mid = llama_vocab_fim_mid(vocab_);
    if (pre == LLAMA_TOKEN_NULL || suf == LLAMA_TOKEN_NULL || mid == LLAMA_TOKEN_NULL) return {};
    return {pre, suf, mid};
}

}  // namespace lmsp
