// The KV of a sequence's first positions, out of the engine and back in: what
// the service writes to its KV files after a turn (saved_prefix), and a file's
// KV loaded on admission in place of a prefill (SubmitRequest::prefix). Both
// happen on the engine thread between two steps; the caller's side only queues
// a request, or reads the slots as the last round left them. A resumed
// sequence's own KV state (a snapshot's) is restored here too.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>

#include "engine.h"
#include "errors.h"
#include "rpc.h"
#include "sequence.h"
#include "slot_choice.h"
#include "tile_matmul.h"

namespace lmsp {

namespace {

// The instruction set ggml's CPU kernels are compiled for (the module and ggml
// share the target flags): vec_dot sums in another order on each, so the KV
// of a prompt written under one is not what another computes.
const char * cpu_kernel_set() {
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
    return "avx512vnni";
#elif defined(__AVX512F__)
    return "avx512";
#elif defined(__AVX2__) && defined(__AVXVNNI__)
    return "avxvnni";
#elif defined(__AVX2__)
    return "avx2";
#elif defined(__AVX__)
    return "avx";
#elif defined(__ARM_FEATURE_MATMUL_INT8)
    return "neon-i8mm";
#elif defined(__ARM_FEATURE_DOTPROD)
    return "neon-dotprod";
#elif defined(__ARM_NEON)
    return "neon";
#else
    return "generic";
#endif
}
// at most this many saved states wait for saved_prefix() (a caller that never asks)
constexpr size_t kMaxSaved = 64;

// A copy's or a load's time into the stats, however it ends.
struct Timed {
    std::atomic<int64_t> & n;
    std::atomic<int64_t> & us;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    Timed(std::atomic<int64_t> & count, std::atomic<int64_t> & micros) : n(count), us(micros) {}
    ~Timed() {
        n++;
        us += std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
    }
};
}  // namespace

// ---------------------------------------------------------------- caller side

std::optional<KvPrefix> Engine::saved_prefix(int64_t seq_id, uint8_t * buffer, size_t capacity) {
    check_open();
    auto req = std::make_unique<Request>();
    req->kind = Request::Kind::saved_prefix;
    req->seq = seq_id;
    req->buffer = buffer;
    req->capacity = buffer != nullptr ? capacity : 0;
    auto fut = req->saved.get_future();
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (stop_) throw EngineClosedError("the engine is closed");
        requests_.push_back(std::move(req));
    }
    cv_.notify_all();
    return fut.get();
}

size_t Engine::saved_prefix_size(int64_t seq_id) const {
    check_open();
    std::lock_guard<std::mutex> lk(mu_);
    for (const Slot & s : slot_view_) {
        if (s.save_seq == seq_id && !s.used) return s.state_size;
    }
    return 0;
}

size_t Engine::cached_prefix(const std::vector<int32_t> & tokens, const std::string & cache_key) const {
    check_open();
    if (!options_.prefix_cache || tokens.empty()) return 0;
    const size_t t_min = plan_.tiled_min(tokens.size());
    const size_t t_end = t_min > 0 ? tokens.size() : 0;
    std::lock_guard<std::mutex> lk(mu_);
    size_t common = 0;
    const int slot = pick_slot(slot_view_, &tokens, cache_key, common);
    if (slot < 0 || common == 0) return 0;
    const Slot & held = slot_view_[size_t(slot)];
    if (common == tokens.size() && held.logits_rows == common) return common;  // asked again (repeat_prompt)
    return usable_rows(common, tokens.size(), plan_.two_kinds(), held.tiled_rows, held.tiled_min, t_end, t_min);
}

size_t Engine::usable_prefix(size_t n_prompt, size_t n_held, size_t tiled_rows, size_t tiled_min) const {
    const size_t t_min = plan_.tiled_min(n_prompt);
    const size_t t_end = t_min > 0 ? n_prompt : 0;
    return window_rows(n_held, usable_rows(std::min(n_held, n_prompt), n_prompt, plan_.two_kinds(), tiled_rows,
                                           tiled_min, t_end, t_min));
}

bool Engine::holds_window(int slot, size_t rows) const {
    // llama-server's rule: a position attends to the window's positions before it
    const llama_pos lowest = llama_memory_seq_pos_min(llama_get_memory(ctx_.get()), slot);
    const int32_t window = llama_model_n_swa(model_.get());
    const llama_pos need = window > 0 ? std::max<llama_pos>(0, llama_pos(rows) - window) : 0;
    return lowest >= 0 && lowest <= need;
}

size_t Engine::window_rows(size_t n_held, size_t usable) const {
    const int32_t window = llama_model_n_swa(model_.get());
    // a state holds its sliding-window layers' last positions only (llama.cpp
    // writes no position outside the window, whatever swa_full): cut shorter,
    // they would lack the window before the cut
    if (window > 0 && n_held > size_t(window) && usable < n_held) return 0;
    return usable;
}

std::string Engine::kv_format() const {
    // the K and V types follow from the plan (batch_plan.cpp, set_context_params)
    const bool v_bf16 = backend_ == "cpu" && options_.batch_invariant && !plan_.fa_tiles;
    std::string f = backend_ + (batch_invariant() ? "/invariant" : "/batched");
    f += std::string("/k-f16/v-") + (v_bf16 ? "bf16" : "f16");
    f += "/fa-tiles-" + std::to_string(plan_.fa_tiles ? kFaTileRows : 0);
    f += "/matmul-tiles-" + std::to_string(plan_.matmul_tiles ? kMinTiledRows : 0);
    f += "/reference-" + std::to_string(int(plan_.reference_kernels));
    // K-quant prompts: vec_dot's bits where the tiles take them, else ggml's tiled matmul's
    f += std::string("/kquants-") + (tile_matmul_kquants_first() ? "vec-dot" : "ggml-tiled");
    f += std::string("/isa-") + cpu_kernel_set();
    return f;
}

// ---------------------------------------------------------------- engine thread

void Engine::publish_slots() {
    if (!slots_changed_) return;
    slots_changed_ = false;
    std::lock_guard<std::mutex> lk(mu_);
    slot_view_ = slots_;
}

std::optional<KvPrefix> Engine::slot_prefix(int slot, uint8_t * buffer, size_t capacity) {
    // llama.cpp writes only the last window of sliding-window layers: enough to
    // continue from the state's end, which the slot must still hold (with
    // swa_full off, its cache may have given those positions to later ones)
    if (!holds_window(slot, slots_[size_t(slot)].tokens.size())) return std::nullopt;
    const Timed timed(kv_copies_, kv_copy_us_);
    const Slot & s = slots_[size_t(slot)];
    KvPrefix p;
    p.tokens = s.tokens;
    p.tiled_rows = s.tiled_rows;
    p.tiled_min = s.tiled_min;
    const size_t size = llama_state_seq_get_size(ctx_.get(), slot);
    if (buffer != nullptr && size <= capacity) {
        // the caller's pages: a copy only (fresh pages would fault here, on the engine thread)
        p.state_size = llama_state_seq_get_data(ctx_.get(), buffer, capacity, slot);
        if (p.state_size == 0) return std::nullopt;
        return p;
    }
    p.state.resize(size);
    const size_t n = llama_state_seq_get_data(ctx_.get(), p.state.data(), p.state.size(), slot);
    if (n == 0) return std::nullopt;
    p.state.resize(n);
    return p;
}

// A slot about to be given to another sequence still holds the KV of a
// persisted one that saved_prefix() has not taken yet: a copy waits for it.
void Engine::keep_for_saving(int slot) {
    Slot & s = slots_[size_t(slot)];
    const int64_t id = s.save_seq;
    s.save_seq = 0;
    if (s.used || s.tokens.empty()) return;
    auto p = slot_prefix(slot);
    if (!p) return;
    if (saved_.size() >= kMaxSaved) saved_.pop_front();
    saved_.emplace_back(id, std::move(*p));
}

void Engine::answer_saved_prefix(Request & req) {
    for (auto it = saved_.begin(); it != saved_.end(); ++it) {
        if (it->first == req.seq) {
            std::optional<KvPrefix> p = std::move(it->second);
            saved_.erase(it);
            req.saved.set_value(std::move(p));
            return;
        }
    }
    for (size_t i = 0; i < slots_.size(); ++i) {
        Slot & s = slots_[i];
        if (s.save_seq != req.seq || s.used) continue;
        s.save_seq = 0;
        slots_changed_ = true;
        std::optional<KvPrefix> p = slot_prefix(int(i), req.buffer, req.capacity);
        throw_if_lost();  // a lost server's cells came back as zeros
        req.saved.set_value(std::move(p));
        return;
    }
    req.saved.set_value(std::nullopt);
}

// A resumed sequence's KV state into its slot; false (the slot left empty)
// when it is not this model's or this sequence's, which is then prefilled.
bool Engine::restore_kv(Sequence & seq, int slot) {
    llama_memory_t mem = llama_get_memory(ctx_.get());
    bool restored = false;
    const auto & kv = *seq.kv_state;
    const size_t n = llama_state_seq_set_data(ctx_.get(), kv.data(), kv.size(), slot);
    const int32_t expect = seq.n_prompt + int32_t(seq.generated.size()) - 1;
    if (n > 0 && llama_memory_seq_pos_min(mem, slot) == 0 && llama_memory_seq_pos_max(mem, slot) == expect - 1) {
        restored = true;
        seq.n_past = expect;
        seq.state = SeqState::generating;
    } else {
        // not this model's state, or not this sequence's: prefill instead
        llama_memory_seq_rm(mem, slot, -1, -1);
    }
    seq.kv_state.reset();
    return restored;
}

// The sequence's KvPrefix into its slot in place of prefilling those tokens,
// when it gives more rows than the slot's own KV (`common` of them); the rows
// the sequence continues from. A state that does not load (another model's or
// engine's, damaged, not of the length it claims) leaves the slot empty.
size_t Engine::load_prefix(Sequence & seq, int slot, size_t common) {
    KvPrefix p = std::move(*seq.prefix);
    seq.prefix.reset();
    if (seq.kv_state) return common;  // a resumed sequence's own KV state comes first
    const size_t n = p.tokens.size();
    const size_t usable = window_rows(
        n, usable_rows(n, seq.feed.size(), plan_.two_kinds(), p.tiled_rows, p.tiled_min, seq.t_end, seq.t_min));
    if (usable <= common) return common;
    const Timed timed(kv_loads_, kv_load_us_);
    llama_memory_t mem = llama_get_memory(ctx_.get());
    forget_slot(slot);
    const size_t read = llama_state_seq_set_data(ctx_.get(), p.state.data(), p.state.size(), slot);
    const bool loaded = read == p.state.size() && holds_window(slot, n) &&
                        llama_memory_seq_pos_max(mem, slot) == int32_t(n) - 1 &&
                        llama_memory_seq_rm(mem, slot, int32_t(usable), -1) && holds_window(slot, usable) &&
                        llama_memory_seq_pos_max(mem, slot) == int32_t(usable) - 1;
    if (!loaded) {
        forget_slot(slot);
        seq.prefix_refused = true;
        return 0;
    }
    seq.n_loaded = int32_t(usable);
    return usable;
}

}  // namespace lmsp
