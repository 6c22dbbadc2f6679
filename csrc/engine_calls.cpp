// The engine's calls from other threads: text and tokens, submitting and
// cancelling sequences, and taking their results. What needs the model's
// context (snapshots, logits) goes to the engine thread as a request.
#include "engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <string>

#include "errors.h"
#include "notifier.h"
#include "rpc.h"
#include "sequence.h"
#include "text.h"

namespace lmsp {

namespace {
// A wait longer than this (about 31 years) is a wait without end.
constexpr double kForever = 1e9;
}  // namespace

const char * finish_name(Finish f) {
    switch (f) {
        case Finish::none: return nullptr;
        case Finish::stop: return "stop";
        case Finish::length: return "length";
        case Finish::cancelled: return "cancelled";
        case Finish::error: return "error";
    }
    return nullptr;
}

// ---------------------------------------------------------------- text

void Engine::check_tokens(const std::vector<int32_t> & tokens, const char * what) const {
    for (int32_t t : tokens) {
        if (t < 0 || t >= n_vocab_) {
            throw InvalidArgument(std::string(what) + ": token id " + std::to_string(t) +
                                  " is outside the vocabulary [0, " + std::to_string(n_vocab_) + ")");
        }
    }
}

std::vector<int32_t> Engine::tokenize(const std::string & text, bool add_special, bool parse_special) const {
    check_open();
    if (text.size() > size_t(INT32_MAX)) throw InvalidArgument("text too long to tokenize");
    std::vector<int32_t> out(text.size() + 4);
    int32_t n = llama_tokenize(vocab_, text.data(), int32_t(text.size()), out.data(), int32_t(out.size()), add_special,
                               parse_special);
    if (n == INT32_MIN) throw InvalidArgument("text too long to tokenize");
    if (n < 0) {
        out.resize(size_t(-n));
        n = llama_tokenize(vocab_, text.data(), int32_t(text.size()), out.data(), int32_t(out.size()), add_special,
                           parse_special);
        if (n < 0) throw NativeFailure("tokenization failed");
    }
    out.resize(size_t(n));
    return out;
}

std::string Engine::detokenize(const std::vector<int32_t> & tokens) const {
    check_open();
    check_tokens(tokens, "detokenize");
    if (tokens.empty()) return {};
    std::string buf(tokens.size() * 8 + 16, '\0');
    int32_t n = llama_detokenize(vocab_, tokens.data(), int32_t(tokens.size()), buf.data(), int32_t(buf.size()), false,
                                 false);
    if (n < 0) {
        buf.resize(size_t(-n));
        n = llama_detokenize(vocab_, tokens.data(), int32_t(tokens.size()), buf.data(), int32_t(buf.size()), false,
                             false);
        if (n < 0) throw NativeFailure("detokenization failed");
    }
    buf.resize(size_t(n));
    std::string out;
    utf8_take(buf, out, true);
    return out;
}

std::string Engine::token_piece(int32_t token) const {
    check_open();
    check_tokens({token}, "token");
    return piece(token);
}

std::string Engine::piece(int32_t token, bool special) const {
    char small[64];
    int32_t n = llama_token_to_piece(vocab_, token, small, int32_t(sizeof(small)), 0, special);
    if (n >= 0) return std::string(small, size_t(n));
    std::string big(size_t(-n), '\0');
    n = llama_token_to_piece(vocab_, token, big.data(), int32_t(big.size()), 0, special);
    if (n < 0) return {};
    big.resize(size_t(n));
    return big;
}

std::string Engine::piece_of(const Sequence & seq, int32_t token) const {
    return piece(token, seq.grammar != nullptr && seq.grammar->preserved(token));
}

std::string Engine::apply_chat_template(const std::vector<ChatMessage> & messages, bool add_generation_prompt) const {
    check_open();
    for (const auto & m : messages) {
        if (m.role != "system" && m.role != "user" && m.role != "assistant") {
            throw InvalidArgument("message role must be 'system', 'user' or 'assistant', not '" + m.role + "'");
        }
        if (m.content.find('\0') != std::string::npos) {
            throw InvalidArgument("message content must not contain NUL characters");
        }
    }
    if (chat_template_) return chat_template_->apply(messages, add_generation_prompt);
    return plain_prompt(messages, add_generation_prompt);
}

std::vector<int32_t> Engine::chat_prompt(const std::vector<ChatMessage> & messages, bool add_generation_prompt) const {
    return tokenize(apply_chat_template(messages, add_generation_prompt), true, true);
}

// ---------------------------------------------------------------- caller side

int64_t Engine::submit(SubmitRequest req) {
    check_open();
    if (req.prompt.empty()) throw InvalidArgument("prompt must contain at least one token");
    if (req.max_tokens < 1) throw InvalidArgument("max_tokens must be >= 1");
    const auto & sp = req.sampling;
    if (!std::isfinite(sp.temperature) || sp.temperature < 0.0f) throw InvalidArgument("temperature must be >= 0");
    if (!std::isfinite(sp.top_p) || !(sp.top_p > 0.0f) || sp.top_p > 1.0f) {
        throw InvalidArgument("top_p must be in (0, 1]");
    }
    if (sp.top_k < 0) throw InvalidArgument("top_k must be >= 0");
    for (const auto & s : req.stop) {
        if (s.empty()) throw InvalidArgument("stop strings must not be empty");
    }
    check_tokens(req.prompt, "prompt");

    auto seq = std::make_unique<Sequence>(req.sampling, req.stop);
    seq->n_prompt = int32_t(req.prompt.size());
    seq->max_tokens = req.max_tokens;
    seq->feed = std::move(req.prompt);
    seq->cache_key = std::move(req.cache_key);
    seq->logprobs = req.logprobs;
    if (req.top_logprobs < 0 || req.top_logprobs > kMaxTopLogprobs) {
        throw InvalidArgument("top_logprobs must be 0 to " + std::to_string(kMaxTopLogprobs));
    }
    seq->top_logprobs = req.logprobs ? req.top_logprobs : 0;
    if (req.grammar) seq->grammar = std::make_unique<Grammar>(vocab_, *req.grammar);
    seq->persist = req.persist;
    if (req.prefix && !req.prefix->tokens.empty()) {
        const auto & held = req.prefix->tokens;
        if (held.size() > seq->feed.size() || !std::equal(held.begin(), held.end(), seq->feed.begin())) {
            throw InvalidArgument("prefix.tokens must be the start of the prompt");
        }
        seq->prefix = std::move(req.prefix);
    }

    const size_t n_resumed = req.resume ? resume(*seq, *req.resume) : 0;
    const size_t needed = seq->feed.size() + n_resumed;
    if (needed > size_t(n_ctx_)) {
        throw ContextLengthError("the prompt needs " + std::to_string(needed) + " tokens" +
                                 (n_resumed ? " (with the resumed ones)" : "") + " but the context holds " +
                                 std::to_string(n_ctx_));
    }
    if (!seq->kv_state) {
        seq->feed.insert(seq->feed.end(), seq->generated.begin(), seq->generated.end());
    }
    seq->t_submit = Clock::now();

    int64_t id;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (stop_) throw EngineClosedError("the engine is closed");
        if (!lost_.empty()) throw BackendLost(lost_);
        id = next_id_++;
        seq->id = id;
        live_.insert(id);
        waiting_.push_back(std::move(seq));
    }
    submitted_++;
    cv_.notify_all();
    return id;
}

// What a resumed sequence already generated, and the KV state it left when given one.
size_t Engine::resume(Sequence & seq, ResumeState & r) const {
    check_tokens(r.generated, "resume.generated");
    // replay the generated tokens through the text stream, then continue
    // right after the text the first run emitted
    for (int32_t t : r.generated) {
        seq.text.push(piece_of(seq, t));
    }
    // the grammar's state rebuilt: every token it took in the first run
    if (seq.grammar) {
        for (int32_t t : r.generated) {
            if (!seq.grammar->accept(t)) throw InvalidArgument("resume.generated does not fit the grammar");
        }
    }
    if (!seq.text.adopt_emitted(r.emitted)) {
        throw InvalidArgument("resume.emitted is not the text of resume.generated");
    }
    seq.generated = r.generated;
    if (r.kv_state && !r.kv_state->empty() && !r.generated.empty()) {
        seq.kv_state = std::move(r.kv_state);
    }
    return r.generated.size();
}

bool Engine::cancel(int64_t seq_id) {
    check_open();
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (live_.count(seq_id) == 0) return false;
        cancels_.insert(seq_id);
    }
    cv_.notify_all();
    return true;
}

Snapshot Engine::snapshot(int64_t seq_id, bool with_kv) {
    check_open();
    auto req = std::make_unique<Request>();
    req->kind = Request::Kind::snapshot;
    req->seq = seq_id;
    req->with_kv = with_kv;
    auto fut = req->snapshot.get_future();
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (stop_) throw EngineClosedError("the engine is closed");
        requests_.push_back(std::move(req));
    }
    cv_.notify_all();
    return fut.get();
}

std::vector<float> Engine::eval_logits(const std::vector<int32_t> & tokens) {
    check_open();
    if (tokens.empty()) throw InvalidArgument("eval_logits needs at least one token");
    check_tokens(tokens, "eval_logits");
    if (tokens.size() > size_t(n_ctx_)) {
        throw ContextLengthError(std::to_string(tokens.size()) + " tokens do not fit the context of " +
                                 std::to_string(n_ctx_));
    }
    auto req = std::make_unique<Request>();
    req->kind = Request::Kind::eval_logits;
    req->tokens = tokens;
    auto fut = req->logits.get_future();
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (stop_) throw EngineClosedError("the engine is closed");
        requests_.push_back(std::move(req));
    }
    cv_.notify_all();
    return fut.get();
}

std::vector<StepResult> Engine::poll() {
    check_open();
    std::vector<StepResult> out;
    std::lock_guard<std::mutex> lk(results_mu_);
    if (results_.empty()) return out;
    out.reserve(results_.size());
    for (auto & r : results_) out.push_back(std::move(r));
    results_.clear();
    clear_notifier(event_fd_);
    if (urgent_waiting_) {
        urgent_waiting_ = false;
        clear_notifier(urgent_fd_);
    }
    return out;
}

bool Engine::wait(double timeout_s, bool urgent) {
    check_open();
    std::unique_lock<std::mutex> lk(results_mu_);
    auto ready = [this, urgent] { return (urgent ? urgent_waiting_ : !results_.empty()) || closed_.load(); };
    std::condition_variable & cv = urgent ? urgent_cv_ : results_cv_;
    if (timeout_s < 0 || timeout_s > kForever) {  // (a longer duration overflows the clock's)
        cv.wait(lk, ready);
    } else {
        cv.wait_for(lk, std::chrono::duration<double>(timeout_s), ready);
    }
    return (urgent ? urgent_waiting_ : !results_.empty()) && !closed_.load();
}

int Engine::fileno() const {
    check_open();
    return event_fd_;
}

int Engine::urgent_fileno() const {
    check_open();
    return urgent_fd_;
}

EngineStats Engine::stats() const {
    check_open();
    EngineStats s;
    {
        std::lock_guard<std::mutex> lk(mu_);
        s.waiting = int64_t(waiting_.size());
    }
    s.active = n_active_.load();
    s.steps = steps_.load();
    s.ubatches = ubatches_.load();
    s.tokens_decoded = tokens_decoded_.load();
    s.filler_rows = filler_rows_.load();
    s.tiled_steps = tiled_steps_.load();
    s.tokens_generated = tokens_generated_.load();
    s.submitted = submitted_.load();
    s.finished = finished_.load();
    s.kv_copies = kv_copies_.load();
    s.kv_copy_us = kv_copy_us_.load();
    s.kv_loads = kv_loads_.load();
    s.kv_load_us = kv_load_us_.load();
    s.embed_passes = embed_passes_.load();
    s.embed_passes_without_logits = embed_passes_without_logits_.load();
    return s;
}

}  // namespace lmsp
