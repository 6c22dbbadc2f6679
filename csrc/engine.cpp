// The engine thread's loop: each round takes the callers' cancels, new
// sequences and requests, admits sequences to slots, then decodes one step
// of every active sequence together and hands the results over at once.
#include "engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <new>

#include "errors.h"
#include "llama_private.h"
#include "notifier.h"
#include "rpc.h"
#include "sequence.h"
#include "slot_choice.h"
#include "text.h"

namespace lmsp {

namespace {
// The counters of a constrained sequence's second draws (constrained_token):
// apart from those of its first draws, the output positions.
constexpr uint64_t kRedraw = uint64_t(1) << 63;

double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

// What a finished sequence's time went to.
Timings timings_of(const Sequence & seq, int32_t n_generated, Clock::time_point now) {
    Timings t;
    if (seq.state != SeqState::waiting) {
        t.queued_ms = ms_between(seq.t_submit, seq.t_admit);
        if (seq.has_first) {
            t.prompt_ms = ms_between(seq.t_admit, seq.t_first);
            t.first_token_ms = ms_between(seq.t_submit, seq.t_first);
            t.decode_ms = ms_between(seq.t_first, now);
            if (n_generated > 1 && t.decode_ms > 0) t.tokens_per_s = (n_generated - 1) * 1000.0 / t.decode_ms;
        }
    }
    t.total_ms = ms_between(seq.t_submit, now);
    return t;
}

}  // namespace

// ---------------------------------------------------------------- engine thread

void Engine::emit(Sequence & seq, StepResult result) {
    // the first text, not the first token: a token whose text is held back (part
    // of a UTF-8 character, or what may begin a stop string) shows nothing yet
    const bool first_text = !seq.reported && !result.text.empty();
    result.urgent = result.finish != Finish::none || first_text;
    seq.reported = seq.reported || first_text;
    outbox_.push_back(std::move(result));
}

// One hand-over per round of the engine loop, whatever number of sequences
// it served: one lock, at most one write to each descriptor, one wake-up. A
// consumer that waits for urgent results only (a commit thread gathering a
// window) is not woken by the others, nor is its descriptor written.
void Engine::push_results() {
    if (outbox_.empty()) return;
    bool was_empty, new_urgent;
    {
        std::lock_guard<std::mutex> lk(results_mu_);
        was_empty = results_.empty();
        bool urgent = false;
        for (auto & r : outbox_) {
            urgent = urgent || r.urgent;
            results_.push_back(std::move(r));
        }
        if (was_empty) signal_notifier(event_wfd_);
        new_urgent = urgent && !urgent_waiting_;
        if (new_urgent) {
            urgent_waiting_ = true;
            signal_notifier(urgent_wfd_);
        }
    }
    outbox_.clear();
    if (was_empty) results_cv_.notify_all();
    if (new_urgent) urgent_cv_.notify_all();
}

void Engine::finish(Sequence & seq, Finish why, const std::string & error, std::vector<int32_t> tokens,
                    std::string text, const char * code) {
    const auto now = Clock::now();
    if (why != Finish::stop && why != Finish::error) {
        text += seq.text.flush();
    }
    StepResult r;
    r.seq = seq.id;
    if (!tokens.empty()) {
        r.logprobs = std::move(seq.next_logprobs);
        r.top_logprobs = std::move(seq.next_top);
    }
    seq.next_logprobs.clear();
    seq.next_top.clear();
    r.tokens = std::move(tokens);
    r.text = std::move(text);
    r.finish = why;
    r.error = error;
    r.code = code;
    r.n_prompt = seq.n_prompt;
    r.n_generated = int32_t(seq.generated.size());
    r.n_cached = seq.n_cached;
    r.n_loaded = seq.n_loaded;
    r.prefix_refused = seq.prefix_refused;
    r.timings = timings_of(seq, r.n_generated, now);
    if (seq.slot >= 0) release_slot(seq, why);
    seq.state = SeqState::finished;
    finished_++;
    {
        std::lock_guard<std::mutex> lk(mu_);
        live_.erase(seq.id);
        cancels_.erase(seq.id);
    }
    emit(seq, std::move(r));
}

void Engine::set_reference_kernels(bool on) {
    if (on != kernels_reference_now_) {
        use_reference_cpu_kernels(ctx_.get(), on);
        kernels_reference_now_ = on;
    }
}

void Engine::order_batch_by_slot() {
    // llama.cpp cuts a batch of several sequences (one KV stream each) into
    // ubatches of consecutive sequence ids, taking them in the order their
    // rows come: rows in the order of admission would cut a run of
    // neighbouring slots into several ubatches, each one more pass over
    // the weights. Sorted by slot, each run is one ubatch.
    const auto n = size_t(batch_.n_tokens);
    bool sorted = true;
    for (size_t k = 1; k < n && sorted; ++k) sorted = batch_.seq_id[k - 1][0] <= batch_.seq_id[k][0];
    if (sorted) return;
    auto & rows = reorder_;
    rows.resize(n);
    for (size_t k = 0; k < n; ++k) {
        rows[k] = {int32_t(k), batch_.token[k], batch_.pos[k], batch_.seq_id[k][0], batch_.logits[k]};
    }
    std::stable_sort(rows.begin(), rows.end(), [](const Row & a, const Row & b) { return a.seq < b.seq; });
    for (size_t k = 0; k < n; ++k) {
        batch_.token[k] = rows[k].token;
        batch_.pos[k] = rows[k].pos;
        batch_.seq_id[k][0] = rows[k].seq;
        batch_.logits[k] = rows[k].logits;
    }
    auto & moved_to = moved_to_;  // old row -> new row
    moved_to.resize(n);
    for (size_t k = 0; k < n; ++k) moved_to[size_t(rows[k].from)] = int32_t(k);
    for (auto & s : active_) {
        if (s->batch_index >= 0) s->batch_index = moved_to[size_t(s->batch_index)];
    }
}

// One step: a batch of every sequence's rows (the generated token of each
// generating sequence, then prompt chunks within what is left), decoded in
// one llama_decode, and a token sampled for each sequence with logits.
void Engine::step() {
    batch_.n_tokens = 0;
    const bool tiled_step = next_step_kind();
    if (tiled_step) tiled_steps_++;
    // generating sequences first: one token each
    std::vector<Sequence *> context_full;
    add_generated(tiled_step, context_full);
    // then prompt chunks within what is left of the batch
    add_prompt_chunks(tiled_step);
    if (tiled_step) plan_.took_tiled_rows(size_t(batch_.n_tokens));

    for (Sequence * s : context_full) {
        finish(*s, Finish::length, "", {}, "");
    }

    if (batch_.n_tokens > 0) {
        order_batch_by_slot();
        add_fillers(tiled_step);
        ubatches_ += options_.n_parallel > 1 ? count_ubatches(batch_, options_.n_batch, step_rows_) : 1;
        const int32_t rc = llama_decode(ctx_.get(), batch_);
        drop_fillers();
        steps_++;
        tokens_decoded_ += batch_.n_tokens - int32_t(fillers_.size());
        throw_if_lost();  // what a lost server's relay answered is not the model's
        if (rc != 0) {
            fail_batch("llama_decode failed (" + std::to_string(rc) + ")");
        } else {
            sample_batch();
        }
    }

    active_.erase(std::remove_if(active_.begin(), active_.end(),
                                 [](const std::unique_ptr<Sequence> & s) { return s->state == SeqState::finished; }),
                  active_.end());
}

// Filler rows in the free slots between runs of a one-row step's slots,
// where they save passes over the weights (batch_plan.cpp); the batch comes
// and goes sorted by slot.
void Engine::add_fillers(bool tiled_step) {
    fillers_.clear();
    if (!fillers_allowed_ || tiled_step) return;
    rows_by_sequence(batch_, step_rows_);
    if (step_rows_.size() < 2) return;
    llama_memory_t mem = llama_get_memory(ctx_.get());
    // a free slot whose stream has a cell left for one more position, and
    // whose KV is no longer than the step attends to anyway: llama.cpp
    // attends to as many cells in every stream of a ubatch, the most any of
    // them uses rounded up to 256
    int32_t cells = -1;  // found at the first free slot between two runs: most steps have none
    auto fillable = [&](int32_t slot) {
        if (slots_[size_t(slot)].used) return false;
        if (cells < 0) {
            int32_t pos_end = 0;
            for (int32_t k = 0; k < batch_.n_tokens; ++k) pos_end = std::max(pos_end, batch_.pos[k] + 1);
            cells = std::min(int32_t(llama_n_ctx_seq(ctx_.get())), (pos_end + 255) / 256 * 256);
        }
        return llama_memory_seq_pos_max(mem, slot) + 2 <= cells;
    };
    filler_sequences(step_rows_, options_.n_batch, fillable, filler_slots_, filler_scratch_);
    if (filler_slots_.empty() || batch_.n_tokens + int32_t(filler_slots_.size()) > options_.n_batch) return;
    for (const int32_t slot : filler_slots_) {
        const int32_t pos = llama_memory_seq_pos_max(mem, slot) + 1;
        add_row(0, pos, slot, false);
        fillers_.emplace_back(slot, pos);
    }
    filler_rows_ += int64_t(fillers_.size());
    order_batch_by_slot();
}

void Engine::drop_fillers() {
    llama_memory_t mem = llama_get_memory(ctx_.get());
    for (const auto & [slot, pos] : fillers_) llama_memory_seq_rm(mem, slot, pos, -1);
}

int32_t Engine::add_row(int32_t token, int32_t pos, int slot, bool logits) {
    const int32_t k = batch_.n_tokens++;
    batch_.token[k] = token;
    batch_.pos[k] = pos;
    batch_.n_seq_id[k] = 1;
    batch_.seq_id[k][0] = slot;
    batch_.logits[k] = logits ? 1 : 0;
    return k;
}

// Whether this step is a tiled one: the two kinds of steps (batch_plan.cpp).
bool Engine::next_step_kind() {
    bool tiled_step = false;
    if (plan_.two_kinds()) {
        bool tiled_work = false, one_row_work = false;
        for (auto & s : active_) {
            if (s->state == SeqState::generating) one_row_work = true;
            if (s->state != SeqState::prefilling) continue;
            (s->n_fed < s->t_end ? tiled_work : one_row_work) = true;
        }
        tiled_step = plan_.next_step_tiled(tiled_work, one_row_work);
        set_reference_kernels(!tiled_step);
    }
    return tiled_step;
}

// The last generated token of each generating sequence (none in a tiled
// step); those whose context is full go to `context_full`.
void Engine::add_generated(bool tiled_step, std::vector<Sequence *> & context_full) {
    for (auto & s : active_) {
        s->batch_index = -1;
        if (s->state != SeqState::generating || tiled_step) continue;
        if (s->n_past >= n_ctx_) {
            context_full.push_back(s.get());
            continue;
        }
        s->batch_index = add_row(s->generated.back(), s->n_past, s->slot, true);
        s->n_past++;
    }
}

// A chunk of each prefilling sequence's prompt, of this step's kind.
void Engine::add_prompt_chunks(bool tiled_step) {
    TiledStep tiled;  // a tiled step's chunk length, the same for each of its sequences
    for (auto & s : active_) {
        if (s->state != SeqState::prefilling) continue;
        const int32_t room = options_.n_batch - batch_.n_tokens;
        if (room <= 0) break;
        const size_t left = s->feed.size() - s->n_fed;
        size_t n = std::min({left, size_t(options_.prefill_chunk), size_t(room), plan_.one_row_cap});
        if (plan_.two_kinds()) {
            const bool tiled_rows = s->n_fed < s->t_end;
            if (tiled_rows != tiled_step) continue;
            if (tiled_rows) {
                n = plan_.tiled_chunk(tiled, s->t_end - s->n_fed, s->t_min, left,
                                      plan_.step_chunk(size_t(options_.prefill_chunk)), size_t(room));
                if (n == 0) continue;  // not in this step
            }
        }
        for (size_t i = 0; i < n; ++i) {
            const bool last = (s->n_fed + 1 == s->feed.size());
            const int32_t k = add_row(s->feed[s->n_fed], s->n_past, s->slot, last);
            if (last) s->batch_index = k;
            s->n_fed++;
            s->n_past++;
        }
    }
}

// A failed decode ends every sequence that had rows in the batch.
void Engine::fail_batch(const std::string & err) {
    llama_memory_t mem = llama_get_memory(ctx_.get());
    forget_free_slots();  // what a failed decode left in the cache is not to be built on
    for (auto & s : active_) {
        if (s->state == SeqState::finished) continue;
        // only sequences that had tokens in this batch are affected
        bool in_batch = false;
        for (int32_t k = 0; k < batch_.n_tokens; ++k) {
            if (batch_.seq_id[k][0] == s->slot) in_batch = true;
        }
        if (in_batch) {
            llama_memory_seq_rm(mem, s->slot, -1, -1);
            finish(*s, Finish::error, err, {}, "");
        }
    }
}

// A token for each sequence whose logits the batch gave.
void Engine::sample_batch() {
    for (auto & sp : active_) {
        Sequence & s = *sp;
        if (s.state == SeqState::finished || s.batch_index < 0) continue;
        const float * logits = llama_get_logits_ith(ctx_.get(), s.batch_index);
        if (logits == nullptr) {
            finish(s, Finish::error, "no logits from llama_decode", {}, "");
            continue;
        }
        if (s.state == SeqState::prefilling) {
            s.state = SeqState::generating;
            if (s.feed.size() == size_t(s.n_prompt)) keep_logits(s, logits);  // the prompt's last row
        }
        if (!s.has_first) {
            s.has_first = true;
            s.t_first = Clock::now();
        }
        take_token(s, logits);
    }
}

// The sampled token's text, handed out, or the sequence's end.
void Engine::take_token(Sequence & s, const float * logits) {
    int32_t token = s.sampler.sample(logits, n_vocab_, s.generated.size());
    if (s.grammar) {
        token = constrained_token(s, logits, token);
        if (token < 0) {  // a dead end: the task fails at once (it would only spin)
            finish(s, Finish::error, "the grammar allows no next token", {}, "", kGrammarDeadEnd);
            return;
        }
    }
    tokens_generated_++;
    if (s.logprobs) {
        // the distribution the token was drawn from: with a grammar, the model's
        // restricted to the tokens the grammar allowed (constrained_token's mask)
        const float * dist = s.grammar ? s.masked.data() : logits;
        s.next_logprobs = {log_probability(dist, n_vocab_, token)};
        if (s.top_logprobs > 0) s.next_top = {top_logprobs(dist, n_vocab_, s.top_logprobs)};
    }
    if (llama_vocab_is_eog(vocab_, token)) {
        finish(s, Finish::stop, "", {}, s.text.flush());
        return;
    }
    s.generated.push_back(token);
    std::string text = s.text.push(piece_of(s, token));
    if (s.text.stopped()) {
        finish(s, Finish::stop, "", {token}, std::move(text));
    } else if (int32_t(s.generated.size()) >= s.max_tokens || s.n_past >= n_ctx_) {
        finish(s, Finish::length, "", {token}, std::move(text));
    } else {
        StepResult r;
        r.seq = s.id;
        r.tokens = {token};
        r.logprobs = std::move(s.next_logprobs);
        r.top_logprobs = std::move(s.next_top);
        s.next_logprobs.clear();
        s.next_top.clear();
        r.text = std::move(text);
        r.n_prompt = s.n_prompt;
        r.n_generated = int32_t(s.generated.size());
        emit(s, std::move(r));
    }
}

// The token a constrained sequence takes: the sampler's pick when the grammar
// allows it, else a draw of its own (a counter of its own: independent of the
// first, so that the token is drawn from the sampler's distribution over the
// allowed tokens, renormalized, where temperature alone shapes it) over the
// tokens the grammar allows; -1 when it allows none. The grammar takes the
// token. A sequence with
// log probabilities has the whole vocabulary checked at every step (s.masked,
// what they report); the others only when the pick is refused.
int32_t Engine::constrained_token(Sequence & s, const float * logits, int32_t token) {
    Grammar & g = *s.grammar;
    const bool allowed = g.allows(token);
    if (!allowed || s.logprobs) g.mask(logits, n_vocab_, s.masked);
    if (!allowed) {
        token = s.sampler.sample(s.masked.data(), n_vocab_, s.generated.size() | kRedraw);
        if (!(s.masked[size_t(token)] > -INFINITY)) return -1;
    }
    // an end-of-generation token ends the sequence and is never fed to the model
    if (llama_vocab_is_eog(vocab_, token)) return token;
    return g.accept(token) ? token : -1;
}

void Engine::fail_all(const std::string & error, const char * code) {
    for (auto & s : active_) {
        if (s->state != SeqState::finished) finish(*s, Finish::error, error, {}, "", code);
    }
    active_.clear();
    forget_free_slots();
}

// What one round of the engine loop takes from the callers.
struct Engine::Round {
    std::deque<std::unique_ptr<Request>> requests;
    std::vector<std::unique_ptr<Sequence>> cancelled_waiting;
    std::vector<std::unique_ptr<Sequence>> admitted;
    std::unordered_set<int64_t> cancels;
};

void Engine::run() {
    for (;;) {
        Round round;
        if (!next_round(round)) break;
        try {
            serve(round);
        } catch (const BackendLost & e) {
            lose(e.what());
        } catch (const std::bad_alloc &) {
            fail_all("out of memory in the engine");
        } catch (const std::exception & e) {
            fail_all(std::string("engine error: ") + e.what());
        }
        push_results();
    }

    // closing: pending requests fail, pending sequences are dropped
    std::deque<std::unique_ptr<Request>> requests;
    {
        std::lock_guard<std::mutex> lk(mu_);
        requests.swap(requests_);
    }
    for (auto & r : requests) {
        auto err = std::make_exception_ptr(EngineClosedError("the engine is closed"));
        fail_request(*r, err);
    }
}

// Waits for work, then takes the round's requests, cancels and the sequences
// that get a slot; false once the engine is closing.
bool Engine::next_round(Round & round) {
    auto & cancels = round.cancels;
    std::unique_lock<std::mutex> lk(mu_);
    const size_t n_slots = slots_.size();
    cv_.wait(lk, [&] {
        return stop_ || !requests_.empty() || !cancels_.empty() || !active_.empty() ||
               (!waiting_.empty() && active_.size() < n_slots);
    });
    if (stop_) return false;
    round.requests.swap(requests_);
    cancels = cancels_;
    // cancelled sequences that never got a slot
    for (auto it = waiting_.begin(); it != waiting_.end();) {
        if (cancels.count((*it)->id)) {
            round.cancelled_waiting.push_back(std::move(*it));
            it = waiting_.erase(it);
        } else {
            ++it;
        }
    }
    size_t free_slots = n_slots - active_.size();
    for (auto & s : active_) {
        if (cancels.count(s->id)) free_slots++;  // freed below, before admission
    }
    while (free_slots > 0 && !waiting_.empty()) {
        round.admitted.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
        free_slots--;
    }
    return true;
}

// Cancels, admissions and requests, then one step.
void Engine::serve(Round & round) {
    for (auto & s : round.cancelled_waiting) finish(*s, Finish::cancelled, "", {}, "");
    for (auto & s : active_) {
        if (round.cancels.count(s->id)) finish(*s, Finish::cancelled, "", {}, "");
    }
    active_.erase(std::remove_if(active_.begin(), active_.end(),
                                 [](const std::unique_ptr<Sequence> & s) { return s->state == SeqState::finished; }),
                  active_.end());
    if (!lost_.empty()) {  // nothing computes any more: the runtime closes this engine
        for (auto & s : round.admitted) finish(*s, Finish::error, lost_, {}, "", kBackendLost);
        for (auto & r : round.requests) fail_request(*r, std::make_exception_ptr(BackendLost(lost_)));
        return;
    }
    for (auto & s : round.admitted) admit(std::move(s));
    // one slot's KV copied out per round at most, so that a running sequence
    // waits for one copy between two steps; the others go to the next rounds
    bool copied = false;
    std::deque<std::unique_ptr<Request>> later;
    for (auto & r : round.requests) {
        if (r->kind == Request::Kind::saved_prefix) {
            if (copied) {
                later.push_back(std::move(r));
                continue;
            }
            copied = true;
        }
        try {
            if (!lost_.empty()) throw BackendLost(lost_);
            handle_request(*r);
            throw_if_lost();
        } catch (const BackendLost & e) {
            fail_request(*r, std::current_exception());
            lose(e.what());
        } catch (...) {
            // this request's caller gets the error; the others of the round go on
            fail_request(*r, std::current_exception());
        }
    }
    if (!later.empty()) {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto it = later.rbegin(); it != later.rend(); ++it) requests_.push_front(std::move(*it));
    }
    if (!active_.empty()) step();
    publish_slots();
}

void Engine::throw_if_lost() const {
    if (rpc_lease_ == nullptr) return;
    const std::string why = rpc_lost(*rpc_lease_);
    if (!why.empty()) throw BackendLost(why);
}

void Engine::lose(const std::string & why) {
    std::deque<std::unique_ptr<Sequence>> waiting;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (lost_.empty()) lost_ = why;
        waiting.swap(waiting_);
    }
    fail_all(why, kBackendLost);
    for (auto & s : waiting) finish(*s, Finish::error, why, {}, "", kBackendLost);
}

std::string Engine::backend_lost() const {
    std::lock_guard<std::mutex> lk(mu_);
    return lost_;
}

}  // namespace lmsp
