// The engine's life: checking its options, loading the model, making the
// context and starting the engine thread; closing it.
#include "engine.h"

#ifdef __linux__
#include <sched.h>
#endif

#include <algorithm>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "errors.h"
#include "llama_private.h"
#include "notifier.h"
#include "rpc.h"
#include "sequence.h"
#include "tile_matmul.h"

namespace lmsp {

namespace {

// A batch larger than every sequence's whole context holds nothing more, and the
// engine's own batch is allocated at the size asked: beyond the whole context
// (and llama.cpp's default of 512, below which nothing changes, since the
// batch size also picks the prompt kernels), it is lowered to that.
EngineOptions bounded(EngineOptions o) {
    const int64_t whole = std::max<int64_t>(int64_t(o.n_ctx) * int64_t(o.n_parallel), 512);
    if (o.n_ctx >= 1 && o.n_parallel >= 1 && int64_t(o.n_batch) > whole) {
        o.n_batch = int32_t(whole);
    }
    return o;
}

void check_options(const EngineOptions & options) {
    if (options.n_ctx < 1) throw InvalidArgument("n_ctx must be >= 1");
    if (options.n_parallel < 1 || options.n_parallel > int32_t(llama_max_parallel_sequences())) {
        throw InvalidArgument("n_parallel must be between 1 and " + std::to_string(llama_max_parallel_sequences()));
    }
    if (options.n_threads < 0 || options.n_threads > GGML_MAX_N_THREADS) {
        throw InvalidArgument("n_threads must be between 0 and " + std::to_string(GGML_MAX_N_THREADS));
    }
    if (options.n_batch < options.n_parallel) throw InvalidArgument("n_batch must be >= n_parallel");
    if (options.prefill_chunk < 1) throw InvalidArgument("prefill_chunk must be >= 1");
}

// As many CPU threads as asked, or with 0 one per core this process may run on.
int32_t cpu_threads(int32_t n_threads) {
    if (n_threads == 0) {
        n_threads = int32_t(std::max(1u, std::thread::hardware_concurrency()));
#ifdef __linux__
        // the cores this process may run on (containers and taskset limit them)
        cpu_set_t set;
        if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) {
            n_threads = std::min(n_threads, int32_t(CPU_COUNT(&set)));
        }
#endif
    }
    return n_threads;
}

}  // namespace

Engine::Engine(const std::string & model_path, const EngineOptions & given) : options_(bounded(given)) {
    log::install();
    static std::once_flag backend_once;
    std::call_once(backend_once, [] {
        llama_backend_init();
        install_tile_matmul();  // before any graph is computed: it joins ggml's list of extra buffer types
    });
    check_options(options_);

    info_ = read_gguf_info(model_path);
    if (!info_.unloadable.empty()) {
        throw ModelFormatError("cannot load model " + model_path + ": " + info_.unloadable);
    }

    // the kernels batch invariance keeps (batch_plan.cpp)
    plan_ = BatchPlan::for_weights(options_, info_);
    load_model(model_path);
    const int32_t n_threads = cpu_threads(options_.n_threads);
    make_context(n_threads);
    ggml_threadpool_params tpp = ggml_threadpool_params_default(n_threads);
    // split over RPC servers, the layers run one place after another: while a
    // server computes, this box's threads sleep instead of spinning
    if (!options_.rpc_servers.empty()) tpp.poll = 0;
    threadpool_.reset(ggml_threadpool_new(&tpp));
    if (!threadpool_) throw NativeFailure("cannot start " + std::to_string(n_threads) + " CPU threads");
    llama_attach_threadpool(ctx_.get(), threadpool_.get(), threadpool_.get());

    if (llama_n_ctx_seq(ctx_.get()) < uint32_t(n_ctx_)) {
        n_ctx_ = int32_t(llama_n_ctx_seq(ctx_.get()));
    }

    // a filler row leaves a KV cache as it was once removed; a recurrent
    // state, or a sliding window that gave its cells to later positions,
    // would not be (batch_plan.cpp)
    fillers_allowed_ = options_.n_parallel > 2 && !llama_model_is_recurrent(model_.get()) &&
                       !llama_model_is_hybrid(model_.get()) &&
                       (llama_model_n_swa(model_.get()) == 0 || options_.swa_full);

    batch_ = llama_batch_init(options_.n_batch, 0, 1);
    batch_allocated_ = true;
    slots_.resize(size_t(options_.n_parallel));

    open_notifier(event_fd_, event_wfd_);
    try {
        open_notifier(urgent_fd_, urgent_wfd_);
    } catch (...) {
        close_notifier(event_fd_, event_wfd_);
        throw;
    }

    thread_ = std::thread([this] { run(); });
}

// The model, its vocabulary and chat template, and one sequence's context.
void Engine::load_model(const std::string & model_path) {
    const EngineOptions & options = options_;
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = options.n_gpu_layers;
    plan_.set_model_params(mp, options);
    RpcSplit split;  // outlives the load: mp points into it
    if (!options.rpc_servers.empty()) {
        split = rpc_split(options.rpc_servers, options.tensor_split, int32_t(info_.n_layer), options.rpc_timeout);
        mp.devices = split.devices.data();
        mp.n_gpu_layers = split.n_gpu_layers;
        mp.split_mode = LLAMA_SPLIT_MODE_LAYER;
        mp.tensor_split = split.server_split.data();
        mp.tensor_buft_overrides = split.overrides.data();
        rpc_lease_ = split.lease;
    } else if (!options.tensor_split.empty()) {
        throw InvalidArgument("tensor_split needs RPC servers to split over");
    }
    // read into memory unless asked to map: a mapped file changed under the engine faults it
    mp.load_mode = options.use_mmap ? LLAMA_LOAD_MODE_MMAP : LLAMA_LOAD_MODE_NONE;
    log::begin_capture();
    try {
        model_.reset(llama_model_load_from_file(model_path.c_str(), mp));
    } catch (const std::bad_alloc &) {
        log::end_capture();
        throw OutOfMemory("out of memory loading " + model_path);
    }
    std::string why = log::end_capture();
    refuse_if_lost();  // a server lost during the load: its relay's answers made what failed
    if (!model_) {
        if (why.find("unknown model architecture") != std::string::npos) {
            throw ModelFormatError("unsupported model architecture '" + info_.architecture + "' in " + model_path);
        }
        if (why.find("alloc") != std::string::npos || why.find("out of memory") != std::string::npos) {
            throw OutOfMemory("out of memory loading " + model_path + " (" + why + ")");
        }
        throw ModelFormatError("cannot load model " + model_path + (why.empty() ? "" : ": " + why));
    }
    if (!llama_model_has_decoder(model_.get()) || llama_model_has_encoder(model_.get())) {
        throw ModelFormatError("unsupported model (not a decoder-only model): " + model_path);
    }
    vocab_ = llama_model_get_vocab(model_.get());
    if (vocab_ == nullptr || llama_vocab_n_tokens(vocab_) <= 0) {
        throw ModelFormatError("model has no vocabulary: " + model_path);
    }
    n_vocab_ = llama_vocab_n_tokens(vocab_);
    chat_template_ = ChatTemplate::from_model(model_.get());
    layer_places_ = model_layer_places(model_.get());
    if (options.huge_pages && !options.use_mmap) {
        huge_pages_ = std::make_unique<HugePageCollapse>(model_cpu_buffers(model_.get()), huge_page_size());
    }

    // one sequence's context never exceeds what the model was trained for
    n_ctx_ = options.n_ctx;
    const int32_t n_train = llama_model_n_ctx_train(model_.get());
    if (n_train > 0 && n_ctx_ > n_train) n_ctx_ = n_train;
}

// The llama context of every slot, on the kernels of the batch plan.
void Engine::make_context(int32_t n_threads) {
    const EngineOptions & options = options_;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = uint32_t(n_ctx_) * uint32_t(options.n_parallel);
    cp.n_batch = uint32_t(options.n_batch);
    cp.n_ubatch = uint32_t(options.n_batch);
    cp.n_seq_max = uint32_t(options.n_parallel);
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    plan_.set_context_params(cp, options);
    cp.swa_full = options.swa_full;
    cp.no_perf = true;
    log::begin_capture();
    try {
        ctx_.reset(llama_init_from_model(model_.get(), cp));
    } catch (const std::bad_alloc &) {
        log::end_capture();
        throw OutOfMemory("out of memory creating the context");
    }
    const std::string why = log::end_capture();
    refuse_if_lost();
    if (!ctx_) {
        if (why.find("alloc") != std::string::npos || why.find("memory") != std::string::npos) {
            throw OutOfMemory("out of memory creating a context of " + std::to_string(cp.n_ctx) + " tokens (" + why +
                              ")");
        }
        throw NativeFailure("cannot create a llama context" + (why.empty() ? "" : ": " + why));
    }
    // (llama_supports_gpu_offload() counts the RPC backend too: a GPU device is asked for)
    const bool gpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU) != nullptr;
    backend_ = (options.n_gpu_layers != 0 && gpu) ? "cuda" : "cpu";
    plan_.settle(batch_invariant(), options);
    if (plan_.one_row_reference()) {
        use_reference_cpu_kernels(ctx_.get(), true);
        kernels_reference_now_ = true;
    }
}

void Engine::refuse_if_lost() const {
    if (rpc_lease_ == nullptr) return;
    const std::string why = rpc_lost(*rpc_lease_);
    if (!why.empty()) throw RpcUnreachable(why);
}

void Engine::close() {
    std::lock_guard<std::mutex> guard(close_mu_);
    if (closed_.exchange(true)) {
        return;
    }
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    {
        // a waiter between its check of closed_ and its sleep would miss the notify
        std::lock_guard<std::mutex> lk(results_mu_);
    }
    results_cv_.notify_all();
    urgent_cv_.notify_all();
    if (thread_.joinable()) {
        thread_.join();
    }
    // reverse order of creation
    active_.clear();
    waiting_.clear();
    if (batch_allocated_) {
        llama_batch_free(batch_);
        batch_allocated_ = false;
    }
    close_embedder();
    if (huge_pages_) huge_pages_->stop();
    ctx_.reset();
    threadpool_.reset();
    // The model (whose vocabulary tokenize, detokenize and the chat template read
    // without the engine's lock, from threads that checked closed_ before this)
    // and the notifiers (which a poll() past its check may still clear) stay
    // until the object goes: Python keeps it alive through any call on it.
}

Engine::~Engine() {
    close();
    close_notifier(event_fd_, event_wfd_);
    close_notifier(urgent_fd_, urgent_wfd_);
}

void Engine::check_open() const {
    if (closed_.load()) throw EngineClosedError("the engine is closed");
}

}  // namespace lmsp
