// The engine: one OS thread owns the llama context and decodes every active
// sequence together, one llama_batch per step (continuous batching).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "batch_plan.h"
#include "chat_template.h"
#include "ggml-cpu.h"
#include "gguf_info.h"
#include "grammar.h"
#include "huge_pages.h"
#include "llama.h"
#include "logprobs.h"
#include "sampler.h"
#include "slot_choice.h"

namespace lmsp {

struct EngineOptions {
    int32_t n_ctx = 4096;  // context of ONE sequence
    int32_t n_parallel = 4;
    int32_t n_threads = 0;  // 0 = all cores
    int32_t n_gpu_layers = 0;
    int32_t n_batch = 512;
    int32_t prefill_chunk = 256;
    // CPU only: keep the kernels whose sums do not depend on the batch (see the
    // batch-invariance note in batch_plan.cpp). False takes llama.cpp's faster
    // defaults for every row: its tiled and split-KV kernels wherever a batch
    // allows them, and repacked weights.
    bool batch_invariant = true;
    // a free slot keeps the KV of its last sequence (its prompt and what was
    // generated), and a new sequence whose tokens start the same continues it
    bool prefix_cache = true;
    // map the model file instead of reading it into memory: the file must then
    // stay as it is while the engine lives (a truncated file faults the process)
    bool use_mmap = false;
    // weights read into memory go into transparent huge pages where the system
    // has them (huge_pages.h); a mapped file's stay the page cache's
    bool huge_pages = true;
    // sliding-window layers keep every position, not only their window's last
    // ones (llama.cpp's swa_full): the prefix cache can then take a slot's
    // history back to any length; false keeps llama-server's smaller cache
    bool swa_full = true;
    // the free slots keep the logits of their prompts' last rows (a prompt asked
    // again samples its first token from them) in at most this many bytes, and
    // at least one row: the least recently kept row gives way (a row is n_vocab
    // floats, 1 MiB for a vocabulary of 262,144 tokens)
    size_t kept_logits_bytes = size_t(1) << 20;
    // ggml RPC servers (HOST:PORT) that hold some of the model's layers, and
    // the shares of this box and of each server (empty: by free memory);
    // rpc.h
    std::vector<std::string> rpc_servers;
    std::vector<float> tensor_split;
    // seconds a server may send and take nothing while its relay waits for it
    // before it is lost (rpc_split)
    double rpc_timeout = 60.0;
};

enum class Finish { none, stop, length, cancelled, error };
const char * finish_name(Finish f);

struct Timings {
    double queued_ms = 0;       // submit -> admitted to a slot
    double prompt_ms = 0;       // admitted -> first token sampled (prefill)
    double first_token_ms = 0;  // submit -> first token
    double decode_ms = 0;       // first token -> finish
    double total_ms = 0;        // submit -> finish
    double tokens_per_s = 0;    // generation rate after the first token
};

// What poll() hands out: the new tokens and text of one sequence in one step.
struct StepResult {
    int64_t seq = 0;
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;                        // each token's, when the submission asked for them
    std::vector<std::vector<TopLogprob>> top_logprobs;  // each token's most likely tokens, when asked for
    std::string text;
    Finish finish = Finish::none;
    std::string error;
    std::string code;  // with Finish::error, the service's error code where the engine knows it
    int32_t n_prompt = 0;
    int32_t n_generated = 0;
    int32_t n_cached = 0;            // leading prompt tokens whose KV a free slot already held (or a given prefix)
    int32_t n_loaded = 0;            // ... of which the submission's KvPrefix gave (0: not used)
    bool prefix_refused = false;     // the submission's KvPrefix did not load (not this engine's, or damaged)
    std::optional<Timings> timings;  // on finish
    bool urgent = false;             // the sequence's first text, or its end
};

struct ResumeState {
    std::vector<int32_t> generated;
    std::string emitted;
    std::optional<std::vector<uint8_t>> kv_state;
};

// The KV of a sequence's first positions, out of the engine and back (the
// service's KV files): the tokens at positions 0.., which leading ones a
// tiled prefill computed (in chunks of at least tiled_min rows), and
// llama.cpp's sequence state of exactly those positions.
struct KvPrefix {
    std::vector<int32_t> tokens;
    size_t tiled_rows = 0;
    size_t tiled_min = 0;
    std::vector<uint8_t> state;
    size_t state_size = 0;  // saved_prefix() into the caller's buffer: the bytes written there (state empty)
};

struct SubmitRequest {
    std::vector<int32_t> prompt;
    int32_t max_tokens = 0;
    SamplingParams sampling;
    std::vector<std::string> stop;
    std::optional<ResumeState> resume;
    // the prefix cache's scope: a sequence reuses only KV left by one with the same key
    std::string cache_key;
    // hand out each generated token's natural log probability under the
    // model's own distribution (a softmax of the logits, before sampling)
    bool logprobs = false;
    // with logprobs: also the `top_logprobs` (0 to kMaxTopLogprobs) most likely tokens at each position
    int32_t top_logprobs = 0;
    // constrain the output to a grammar (grammar.h); a resumed sequence's
    // grammar takes its generated tokens first
    std::optional<GrammarSpec> grammar;
    // the KV of the prompt's first tokens (tokens must be its start): loaded on
    // admission in place of prefilling them, when it holds more usable rows
    // than a slot's cache; a state that does not load is reported, then prefilled
    std::optional<KvPrefix> prefix;
    // keep the KV the sequence leaves for saved_prefix() (until it is asked for)
    bool persist = false;
};

struct Snapshot {
    std::vector<int32_t> generated;
    std::string emitted;
    int32_t n_prompt = 0;
    std::optional<std::vector<uint8_t>> kv_state;
};

struct EngineStats {
    int64_t active = 0;
    int64_t waiting = 0;
    int64_t steps = 0;
    int64_t ubatches = 0;          // llama.cpp's passes over the weights (one or more per step)
    int64_t tokens_decoded = 0;    // tokens through llama_decode (prompt + generated)
    int64_t filler_rows = 0;       // rows in free slots that joined two runs of slots in one ubatch
    int64_t tiled_steps = 0;       // steps of prompt chunks on the tiled kernels
    int64_t tokens_generated = 0;  // tokens sampled
    int64_t submitted = 0;
    int64_t finished = 0;
    int64_t kv_copies = 0;   // KvPrefix states copied out of the KV cache (saved_prefix, a slot reused first)
    int64_t kv_copy_us = 0;  // ... the engine thread's time in those copies
    int64_t kv_loads = 0;    // KvPrefix states loaded into a slot (or refused)
    int64_t kv_load_us = 0;  // ... the engine thread's time in those loads

    // the embeddings' llama_decode calls, and those of them that skipped the output layer
    int64_t embed_passes = 0;
    int64_t embed_passes_without_logits = 0;
};

// Unknown or finished sequence id (maps to KeyError).
struct UnknownSequence : std::out_of_range {
    using std::out_of_range::out_of_range;
};

struct Sequence;  // sequence.h
class Embedder;   // embedder.h
struct RpcLease;  // rpc.h

class Engine {
public:
    Engine(const std::string & model_path, const EngineOptions & options);
    ~Engine();
    Engine(const Engine &) = delete;
    Engine & operator=(const Engine &) = delete;

    const GgufInfo & info() const { return info_; }
    int32_t n_ctx() const { return n_ctx_; }
    int32_t n_vocab() const { return n_vocab_; }
    int32_t n_parallel() const { return options_.n_parallel; }
    const std::string & backend() const { return backend_; }
    // Where each layer is, the output layer last: "cpu", or an RPC server's HOST:PORT.
    const std::vector<std::string> & layer_places() const { return layer_places_; }
    // The bytes of weights in huge pages so far, and whether more are to come (huge_pages.h).
    size_t weights_in_huge_pages() const { return huge_pages_ ? huge_pages_->bytes() : 0; }
    bool huge_pages_pending() const { return huge_pages_ && huge_pages_->pending(); }
    bool batch_invariant() const { return options_.batch_invariant && backend_ == "cpu"; }
    // Whether the CPU backend runs ggml's reference kernels (batch invariance on K-quant weights).
    bool reference_kernels() const { return plan_.reference_kernels; }

    std::vector<int32_t> tokenize(const std::string & text, bool add_special, bool parse_special) const;
    std::string detokenize(const std::vector<int32_t> & tokens) const;
    std::string token_piece(int32_t token) const;  // one token's bytes, as generation emits them
    // The model's chat template (chat_template.h), or the plain format of a model without one.
    std::string apply_chat_template(const std::vector<ChatMessage> & messages, bool add_generation_prompt) const;
    // The prompt a chat makes, as llama-server feeds it to the model: the
    // text above tokenized with the model's special tokens added (BOS where
    // the vocabulary asks for it) and special-token text parsed.
    std::vector<int32_t> chat_prompt(const std::vector<ChatMessage> & messages, bool add_generation_prompt) const;
    bool has_chat_template() const { return chat_template_ != nullptr; }
    const ChatTemplate * chat_template() const { return chat_template_.get(); }  // null: none

    int64_t submit(SubmitRequest request);
    bool cancel(int64_t seq_id);
    Snapshot snapshot(int64_t seq_id, bool with_kv);
    // The KV a finished sequence submitted with `persist` left in its slot (the
    // rows a later prompt can take over), taken between two steps; none when
    // the slot was given to another sequence first, or the sequence ended
    // cancelled or on an error. Once per sequence.
    // `buffer`: where the state goes when it fits (`capacity` bytes, its pages
    // touched by the caller, so that the engine thread only copies).
    std::optional<KvPrefix> saved_prefix(int64_t seq_id, uint8_t * buffer = nullptr, size_t capacity = 0);
    // The state's size saved_prefix() would give now (0: unknown, or none waits).
    size_t saved_prefix_size(int64_t seq_id) const;
    // How many leading tokens of `tokens` a free slot's cache would give a
    // sequence submitted now with `cache_key` (as admission would pick it).
    size_t cached_prefix(const std::vector<int32_t> & tokens, const std::string & cache_key) const;
    // How many of the `n_held` leading rows of a KvPrefix a prompt of
    // `n_prompt` tokens that starts with them may continue from.
    size_t usable_prefix(size_t n_prompt, size_t n_held, size_t tiled_rows, size_t tiled_min) const;
    // What a KvPrefix's numbers depend on besides the weights: the backend,
    // batch invariance and the kinds of rows, the K and V types.
    std::string kv_format() const;
    // the model's sliding window (0: none) and whether its layers keep every position
    int32_t n_swa() const { return llama_model_n_swa(model_.get()); }
    bool swa_full() const { return options_.swa_full; }
    std::vector<StepResult> poll();
    // timeout_s < 0: no timeout. urgent: return only once an urgent result
    // (a sequence's first text or its end) is waiting, not for any result
    bool wait(double timeout_s, bool urgent = false);
    int fileno() const;         // readable while any result waits
    int urgent_fileno() const;  // readable while an urgent result waits
    std::vector<float> eval_logits(const std::vector<int32_t> & tokens);
    // normalized embeddings, one per input (embedder.cpp)
    std::vector<std::vector<float>> embed(const std::vector<std::vector<int32_t>> & inputs);
    // the fill-in-the-middle tokens (prefix, suffix, middle); empty where the vocabulary lacks one
    std::vector<int32_t> fim_tokens() const;
    EngineStats stats() const;
    void close();
    bool closed() const { return closed_.load(); }
    // why an RPC server the model is split over was lost (empty: none was);
    // from then on every call that would compute raises BackendLost
    std::string backend_lost() const;

private:
    struct ModelDeleter {
        void operator()(llama_model * m) const { llama_model_free(m); }
    };
    struct ContextDeleter {
        void operator()(llama_context * c) const { llama_free(c); }
    };
    struct ThreadpoolDeleter {
        void operator()(ggml_threadpool * t) const { ggml_threadpool_free(t); }
    };

    struct Request {
        enum class Kind { snapshot, eval_logits, saved_prefix } kind;
        int64_t seq = 0;
        bool with_kv = false;
        std::vector<int32_t> tokens;
        uint8_t * buffer = nullptr;  // saved_prefix: the caller's
        size_t capacity = 0;
        std::promise<Snapshot> snapshot;
        std::promise<std::vector<float>> logits;
        std::promise<std::optional<KvPrefix>> saved;
    };

    // construction (engine_setup.cpp)
    void load_model(const std::string & model_path);
    void close_embedder();
    void make_context(int32_t n_threads);
    void refuse_if_lost() const;  // RpcUnreachable when a server was lost during the load

    // callers' threads (engine_calls.cpp)
    void check_open() const;
    void check_tokens(const std::vector<int32_t> & tokens, const char * what) const;
    std::string piece(int32_t token, bool special = false) const;
    std::string piece_of(const Sequence & seq, int32_t token) const;  // with its grammar's preserved tokens
    size_t resume(Sequence & seq, ResumeState & r) const;             // a resumed submission's state

    // engine thread: requests (engine_requests.cpp)
    void handle_request(Request & req);
    static void fail_request(Request & req, std::exception_ptr error);
    void answer_snapshot(Request & req);
    void answer_logits(Request & req);
    bool decode_positions(Request & req, size_t done, size_t n, std::vector<float> & out);
    void answer_saved_prefix(Request & req);
    // the slot's KV as a KvPrefix (its state into `buffer` when it fits)
    std::optional<KvPrefix> slot_prefix(int slot, uint8_t * buffer = nullptr, size_t capacity = 0);
    void keep_for_saving(int slot);  // before the slot is reused: its awaited KV into saved_

    // engine thread: the loop (engine.cpp)
    struct Round;
    void run();
    bool next_round(Round & round);
    void serve(Round & round);
    void admit(std::unique_ptr<Sequence> seq);
    size_t take_prefix(Sequence & seq, int slot, size_t common);
    // a prompt asked again (engine_slots.cpp): the slot holds its KV and kept
    // the logits of its last row; its first token is sampled from them
    bool repeat_prompt(Sequence & seq, int slot, size_t common);
    void keep_logits(const Sequence & seq, const float * logits);  // its prompt's last row
    void drop_logits(int slot, size_t from);                       // the slot's KV changes from position `from` on
    // whether a slot's KV can continue a sequence from `rows` positions: its
    // sliding-window layers (if any) hold the window before them
    bool holds_window(int slot, size_t rows) const;
    // `usable` rows of a state of `n_held` positions, or 0 where its
    // sliding-window layers (which a state holds the last window of) cannot
    // continue from fewer positions than it holds
    size_t window_rows(size_t n_held, size_t usable) const;
    bool restore_kv(Sequence & seq, int slot);
    size_t load_prefix(Sequence & seq, int slot, size_t common);
    void publish_slots();  // slots_ -> slot_view_, when they changed
    void forget_slot(int slot);
    void forget_free_slots();
    // one step
    void step();
    // a row into the batch; its index there
    int32_t add_row(int32_t token, int32_t pos, int slot, bool logits);
    bool next_step_kind();  // true: a tiled step
    void add_generated(bool tiled_step, std::vector<Sequence *> & context_full);
    void add_prompt_chunks(bool tiled_step);
    void order_batch_by_slot();  // rows of one slot stay in their order
    // a batch row, with its place before the sort
    struct Row {
        int32_t from, token, pos, seq;
        int8_t logits;
    };
    std::vector<Row> reorder_;       // order_batch_by_slot's scratch
    std::vector<int32_t> moved_to_;  // ... and its old row -> new row
    SeqRows step_rows_;              // count_ubatches' scratch
    // filler rows (batch_plan.cpp): whether this model's cache takes them
    // back exactly; this step's, as (slot, position)
    bool fillers_allowed_ = false;
    std::vector<int32_t> filler_slots_;
    std::vector<std::pair<int32_t, int32_t>> fillers_;
    SeqRows filler_scratch_;
    void add_fillers(bool tiled_step);  // into a sorted batch; sorts it again
    void drop_fillers();                // after the step: their cells back to the free slots
    void fail_batch(const std::string & err);
    void sample_batch();
    void take_token(Sequence & s, const float * logits);
    int32_t constrained_token(Sequence & s, const float * logits, int32_t token);
    // results
    void finish(Sequence & seq, Finish why, const std::string & error, std::vector<int32_t> tokens, std::string text,
                const char * code = "");
    void release_slot(Sequence & seq, Finish why);
    void emit(Sequence & seq, StepResult result);  // into outbox_, handed over at the end of the round
    void push_results();                           // outbox_ -> results_
    void fail_all(const std::string & error, const char * code = "");
    // after a step or a request: BackendLost when an RPC server was lost meanwhile
    void throw_if_lost() const;
    // a server was lost: every sequence ends with kBackendLost, and later ones too
    void lose(const std::string & why);

    EngineOptions options_;
    GgufInfo info_;
    std::vector<std::string> layer_places_;
    BatchPlan plan_;                      // the kernels of each row, and the two kinds of steps
    bool kernels_reference_now_ = false;  // what the CPU backend is set to
    void set_reference_kernels(bool on);
    std::string backend_;
    int32_t n_ctx_ = 0;
    int32_t n_vocab_ = 0;

    // the RPC servers the model's buffers are on (rpc.h); before model_, so held until it is freed
    std::shared_ptr<RpcLease> rpc_lease_;
    // owned llama.cpp objects: freed in reverse order (batch, context, threadpool, model)
    std::unique_ptr<llama_model, ModelDeleter> model_;
    std::unique_ptr<HugePageCollapse> huge_pages_;  // after model_, so stopped before the weights are freed
    // CPU threads kept for the engine's life, as llama-bench and llama-server
    // do; without one, ggml starts and joins its threads at every step
    std::unique_ptr<ggml_threadpool, ThreadpoolDeleter> threadpool_;
    std::unique_ptr<llama_context, ContextDeleter> ctx_;
    llama_batch batch_{};
    bool batch_allocated_ = false;
    const llama_vocab * vocab_ = nullptr;
    std::unique_ptr<ChatTemplate> chat_template_;  // null: the model has none
    std::mutex embedder_mu_;
    std::shared_ptr<Embedder> embedder_;  // made by the first embed(); after model_, so freed before it
    std::atomic<int64_t> embed_passes_{0};
    std::atomic<int64_t> embed_passes_without_logits_{0};

    // shared with callers, guarded by mu_
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::unique_ptr<Sequence>> waiting_;
    std::unordered_set<int64_t> live_;
    std::unordered_set<int64_t> cancels_;
    std::deque<std::unique_ptr<Request>> requests_;
    bool stop_ = false;
    std::string lost_;  // backend_lost(); written by the engine thread only
    int64_t next_id_ = 1;
    std::vector<Slot> slot_view_;  // the slots as of the last round, for cached_prefix()

    // results, guarded by results_mu_
    mutable std::mutex results_mu_;
    std::condition_variable results_cv_;  // results_ became non-empty
    std::condition_variable urgent_cv_;   // urgent_waiting_ became true
    std::deque<StepResult> results_;
    bool urgent_waiting_ = false;  // results_ holds an urgent result
    int event_fd_ = -1;            // readable while results_ is not empty
    int event_wfd_ = -1;           // write end (same as event_fd_ for an eventfd)
    int urgent_fd_ = -1;           // readable while urgent_waiting_
    int urgent_wfd_ = -1;

    // engine thread only
    std::vector<StepResult> outbox_;  // this round's results, handed over together
    std::vector<std::unique_ptr<Sequence>> active_;
    // one KV stream each; a free one keeps its last sequence's KV (the prefix cache)
    std::vector<Slot> slots_;
    std::vector<std::vector<float>> slot_logits_;  // each slot's kept logits (Slot::logits_rows)
    std::deque<int> kept_order_;  // the slots whose row in slot_logits_ is allocated, least recently kept first
    uint64_t slot_clock_ = 0;
    bool slots_changed_ = true;
    // KV of persisted sequences whose slot was reused before saved_prefix() asked
    std::deque<std::pair<int64_t, KvPrefix>> saved_;

    std::atomic<int64_t> filler_rows_{0}, tiled_steps_{0};
    std::atomic<int64_t> steps_{0}, ubatches_{0}, tokens_decoded_{0}, tokens_generated_{0}, submitted_{0}, finished_{0};
    std::atomic<int64_t> kv_copies_{0}, kv_copy_us_{0}, kv_loads_{0}, kv_load_us_{0};
    std::atomic<int64_t> n_active_{0};

    std::atomic<bool> closed_{false};
    std::mutex close_mu_;
    std::thread thread_;
};

}  // namespace lmsp
