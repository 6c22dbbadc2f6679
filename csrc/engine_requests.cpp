// The requests other threads make of the engine thread, answered between two
// steps: a snapshot of a sequence (what it generated and emitted, and the KV
// state it may resume from), and the logits of every position of a token
// sequence (eval_logits, on an idle engine).
#include "engine.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "errors.h"
#include "rpc.h"
#include "sequence.h"

namespace lmsp {

namespace {
// What every snapshot of a sequence holds.
Snapshot text_of(const Sequence & seq) {
    Snapshot snap;
    snap.generated = seq.generated;
    snap.emitted = seq.text.emitted();
    snap.n_prompt = seq.n_prompt;
    return snap;
}
}  // namespace

void Engine::handle_request(Request & req) {
    if (req.kind == Request::Kind::snapshot) {
        answer_snapshot(req);
    } else if (req.kind == Request::Kind::saved_prefix) {
        answer_saved_prefix(req);
    } else {
        answer_logits(req);
    }
}

void Engine::fail_request(Request & req, std::exception_ptr error) {
    try {
        if (req.kind == Request::Kind::snapshot) {
            req.snapshot.set_exception(error);
        } else if (req.kind == Request::Kind::saved_prefix) {
            req.saved.set_exception(error);
        } else {
            req.logits.set_exception(error);
        }
    } catch (const std::future_error &) {
        // answered already, before the error
    }
}

// ---------------------------------------------------------------- snapshot

void Engine::answer_snapshot(Request & req) {
    Sequence * found = nullptr;
    for (auto & s : active_) {
        if (s->id == req.seq) found = s.get();
    }
    if (found == nullptr) {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto & s : waiting_) {
            if (s->id == req.seq) found = s.get();
        }
        if (found != nullptr) {
            Snapshot snap = text_of(*found);
            if (req.with_kv && found->kv_state) snap.kv_state = found->kv_state;
            req.snapshot.set_value(std::move(snap));
            return;
        }
    }
    if (found == nullptr) {
        req.snapshot.set_exception(std::make_exception_ptr(
            UnknownSequence("sequence " + std::to_string(req.seq) + " is unknown or finished")));
        return;
    }
    Snapshot snap = text_of(*found);
    if (req.with_kv && found->state == SeqState::generating && !found->generated.empty()) {
        // the KV holds prompt + generated[:-1]; the last token is decoded next step
        const size_t size = llama_state_seq_get_size(ctx_.get(), found->slot);
        std::vector<uint8_t> data(size);
        const size_t n = llama_state_seq_get_data(ctx_.get(), data.data(), data.size(), found->slot);
        if (n > 0) {
            data.resize(n);
            snap.kv_state = std::move(data);
        }
        throw_if_lost();  // a lost server's cells came back as zeros
    }
    req.snapshot.set_value(std::move(snap));
}

// ---------------------------------------------------------------- logits evaluation

// eval_logits: a fresh sequence in slot 0, every position's logits
void Engine::answer_logits(Request & req) {
    bool busy;
    {
        std::lock_guard<std::mutex> lk(mu_);
        busy = !active_.empty() || !waiting_.empty();
    }
    if (busy) {
        req.logits.set_exception(
            std::make_exception_ptr(NativeFailure("eval_logits needs an idle engine (no active or waiting sequence)")));
        return;
    }
    llama_memory_t mem = llama_get_memory(ctx_.get());
    forget_slot(0);
    set_reference_kernels(plan_.one_row_reference());  // every row the one-row way: any prefix gives the same rows
    std::vector<float> out;
    try {
        out.resize(req.tokens.size() * size_t(n_vocab_));
    } catch (const std::bad_alloc &) {
        req.logits.set_exception(std::make_exception_ptr(OutOfMemory("out of memory for the logits")));
        return;
    }
    size_t done = 0;
    while (done < req.tokens.size()) {
        const size_t n = std::min({req.tokens.size() - done, size_t(options_.n_batch), plan_.one_row_cap});
        if (!decode_positions(req, done, n, out)) return;
        tokens_decoded_ += int64_t(n);
        done += n;
    }
    llama_memory_seq_rm(mem, 0, -1, -1);
    req.logits.set_value(std::move(out));
}

// The request's tokens [done, done + n) at their positions in slot 0, their
// logits into `out`; false (the request answered with the error) on a failure.
bool Engine::decode_positions(Request & req, size_t done, size_t n, std::vector<float> & out) {
    llama_memory_t mem = llama_get_memory(ctx_.get());
    batch_.n_tokens = 0;
    for (size_t i = 0; i < n; ++i) {
        const int32_t k = batch_.n_tokens++;
        batch_.token[k] = req.tokens[done + i];
        batch_.pos[k] = int32_t(done + i);
        batch_.n_seq_id[k] = 1;
        batch_.seq_id[k][0] = 0;
        batch_.logits[k] = 1;
    }
    const int32_t rc = llama_decode(ctx_.get(), batch_);
    throw_if_lost();
    if (rc != 0) {
        llama_memory_seq_rm(mem, 0, -1, -1);
        req.logits.set_exception(
            std::make_exception_ptr(NativeFailure("llama_decode failed (" + std::to_string(rc) + ")")));
        return false;
    }
    for (size_t i = 0; i < n; ++i) {
        const float * l = llama_get_logits_ith(ctx_.get(), int32_t(i));
        if (l == nullptr) {
            llama_memory_seq_rm(mem, 0, -1, -1);
            req.logits.set_exception(std::make_exception_ptr(NativeFailure("no logits from llama_decode")));
            return false;
        }
        std::memcpy(out.data() + (done + i) * size_t(n_vocab_), l, sizeof(float) * size_t(n_vocab_));
    }
    return true;
}

}  // namespace lmsp
