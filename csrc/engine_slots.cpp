// A sequence's slot: which one it takes on admission and what of the slot's
// KV it continues from (the prefix cache), what a slot keeps when its
// sequence ends, and the logits of the last prompt row a slot keeps, from
// which a prompt asked again takes its first token without a prefill.
#include <algorithm>

#include "engine.h"
#include "sequence.h"
#include "slot_choice.h"

namespace lmsp {

// A finished sequence's slot, free again: it keeps the sequence's KV for the
// prefix cache unless the sequence ended on an error.
void Engine::release_slot(Sequence & seq, Finish why) {
    Slot & slot = slots_[size_t(seq.slot)];
    if (options_.prefix_cache && why != Finish::error) {
        // the KV at positions < n_past: the prompt, then the generated tokens fed back
        auto & held = slot.tokens;
        held.assign(seq.feed.begin(), seq.feed.begin() + seq.n_prompt);
        held.insert(held.end(), seq.generated.begin(), seq.generated.end());
        held.resize(std::min(held.size(), size_t(std::max(seq.n_past, 0))));
        slot.tiled_rows = std::min(seq.t_end, held.size());
        slot.tiled_min = seq.t_min;
        slot.key = seq.cache_key;
        // with two kinds of rows, the rows after a tiled prompt (its answer, decoded
        // one row at a time) are never taken over: a prefill computes them tiled
        if (plan_.two_kinds() && slot.tiled_rows > 0) held.resize(slot.tiled_rows);
        // a sliding-window model's saved state holds the window before its end
        // only, and a next prompt cut back to leave a tiled chunk to prefill
        // could not continue it: a persisted one leaves that chunk out
        const size_t window = size_t(std::max(llama_model_n_swa(model_.get()), 0));
        if (seq.persist && window > 0 && slot.tiled_min > 0 && held.size() > window + slot.tiled_min) {
            held.resize(held.size() - slot.tiled_min);
            slot.tiled_rows = std::min(slot.tiled_rows, held.size());
        }
        drop_logits(seq.slot, held.size());
        if (!llama_memory_seq_rm(llama_get_memory(ctx_.get()), seq.slot, int32_t(held.size()), -1)) {
            forget_slot(seq.slot);
        } else if (seq.persist && (why == Finish::stop || why == Finish::length) && !held.empty()) {
            slot.save_seq = seq.id;
            slot.state_size = llama_state_seq_get_size(ctx_.get(), seq.slot);  // counts, copies nothing
        }
    } else {
        forget_slot(seq.slot);
    }
    slot.freed_at = ++slot_clock_;
    slot.used = false;
    slots_changed_ = true;
    seq.slot = -1;
    n_active_--;
}

void Engine::forget_slot(int slot) {
    llama_memory_seq_rm(llama_get_memory(ctx_.get()), slot, -1, -1);
    slots_[size_t(slot)].tokens.clear();
    slots_[size_t(slot)].tiled_rows = 0;
    slots_[size_t(slot)].tiled_min = 0;
    slots_[size_t(slot)].save_seq = 0;
    slots_[size_t(slot)].logits_rows = 0;
    slots_changed_ = true;
}

void Engine::forget_free_slots() {
    for (size_t i = 0; i < slots_.size(); ++i) {
        if (!slots_[i].used) forget_slot(int(i));
    }
}

void Engine::admit(std::unique_ptr<Sequence> seq) {
    // a sequence restored from its KV state takes none of a slot's cache
    size_t common = 0;
    const bool reuse = options_.prefix_cache && !seq->kv_state;
    const int slot = pick_slot(slots_, reuse ? &seq->feed : nullptr, seq->cache_key, common);
    seq->slot = slot;
    if (slots_[size_t(slot)].save_seq != 0) keep_for_saving(slot);
    slots_[size_t(slot)].used = true;
    slots_changed_ = true;
    n_active_++;
    seq->t_admit = Clock::now();
    // a long enough prompt is prefilled tiled (two kinds of steps)
    seq->t_min = plan_.tiled_min(size_t(seq->n_prompt));
    seq->t_end = seq->t_min > 0 ? size_t(seq->n_prompt) : 0;
    if (repeat_prompt(*seq, slot, common)) {
        if (seq->state != SeqState::finished) active_.push_back(std::move(seq));
        return;
    }
    common = take_prefix(*seq, slot, common);
    if (seq->prefix) common = load_prefix(*seq, slot, common);

    const bool restored = seq->kv_state && restore_kv(*seq, slot);
    if (!restored) {
        if (seq->feed.size() < size_t(seq->n_prompt) + seq->generated.size()) {
            seq->feed.insert(seq->feed.end(), seq->generated.begin(), seq->generated.end());
        }
        seq->n_fed = common;
        seq->n_past = int32_t(common);
        seq->n_cached = int32_t(common);
        seq->state = SeqState::prefilling;
    }
    if (!seq->generated.empty()) {
        seq->has_first = true;
        seq->t_first = seq->t_admit;
    }
    // a resumed sequence that had already reached its end
    if (seq->text.stopped()) {
        finish(*seq, Finish::stop, "", {}, "");
        return;
    }
    if (int32_t(seq->generated.size()) >= seq->max_tokens) {
        finish(*seq, Finish::length, "", {}, "");
        return;
    }
    active_.push_back(std::move(seq));
}

// How many leading positions of the slot's KV the sequence continues from, of
// the `common` tokens they share (pick_slot; 0 when it reuses none): the rest
// of the KV is dropped, or all of it when none is kept.
size_t Engine::take_prefix(Sequence & seq, int slot, size_t common) {
    llama_memory_t mem = llama_get_memory(ctx_.get());
    const Slot & held = slots_[size_t(slot)];
    common = usable_rows(common, seq.feed.size(), plan_.two_kinds(), held.tiled_rows, held.tiled_min, seq.t_end,
                         seq.t_min);
    if (common > 0) {
        drop_logits(slot, common);
        // a cache that cannot drop a sequence's tail (recurrent models), or whose
        // sliding-window layers no longer hold the window before it, is not reused
        if (!llama_memory_seq_rm(mem, slot, int32_t(common), -1) || !holds_window(slot, common) ||
            llama_memory_seq_pos_max(mem, slot) != int32_t(common) - 1) {
            common = 0;
            forget_slot(slot);
        }
        slots_[size_t(slot)].tokens.clear();
    } else {
        common = 0;
        forget_slot(slot);
    }
    return common;
}

// ---------------------------------------------------------------- a prompt asked again

// The logits of a sequence's last prompt row, computed by its prefill: kept
// with its slot while the slot's KV holds the rows that gave them (a prompt
// asked again then samples its first token from them: repeat_prompt).
// At most options_.kept_logits_bytes of rows (one at least): a slot without a
// row takes the one kept least recently, whose slot no longer answers from it.
void Engine::keep_logits(const Sequence & seq, const float * logits) {
    if (!options_.prefix_cache) return;
    if (slot_logits_.size() != slots_.size()) slot_logits_.resize(slots_.size());
    const size_t most = std::max<size_t>(1, options_.kept_logits_bytes / (sizeof(float) * size_t(n_vocab_)));
    std::vector<float> & row = slot_logits_[size_t(seq.slot)];
    const auto kept = std::find(kept_order_.begin(), kept_order_.end(), seq.slot);
    if (kept != kept_order_.end()) {
        kept_order_.erase(kept);
    } else if (kept_order_.size() >= most) {
        const int oldest = kept_order_.front();
        kept_order_.pop_front();
        slots_[size_t(oldest)].logits_rows = 0;
        row.swap(slot_logits_[size_t(oldest)]);
    }
    row.assign(logits, logits + n_vocab_);
    kept_order_.push_back(seq.slot);
    slots_[size_t(seq.slot)].logits_rows = size_t(seq.n_prompt);
    slots_changed_ = true;
}

void Engine::drop_logits(int slot, size_t from) {
    Slot & s = slots_[size_t(slot)];
    if (s.logits_rows > from) {
        s.logits_rows = 0;
        slots_changed_ = true;
    }
}

// Whether the sequence starts from the logits its slot kept: its prompt is
// exactly the tokens whose last row gave them (`common` of the slot's tokens,
// pick_slot), with no generated tokens of a resume to feed. The slot then
// drops the rows after the prompt (an earlier answer's), and the first token
// is sampled from those logits as a prefill's last step would sample it: the
// prompt's KV and that row's logits are what a prefill would compute (with
// batch invariance, bit for bit). A file's KV (`prefix`) gives at most the
// prompt's first n - 1 rows: it is not loaded.
bool Engine::repeat_prompt(Sequence & seq, int slot, size_t common) {
    const size_t n = seq.feed.size();
    if (!seq.generated.empty() || seq.kv_state || n != size_t(seq.n_prompt) || common != n ||
        slots_[size_t(slot)].logits_rows != n) {
        return false;
    }
    llama_memory_t mem = llama_get_memory(ctx_.get());
    // a cache that cannot drop a sequence's tail, or whose sliding-window layers
    // no longer hold the window before the prompt's end: take_prefix decides
    if (!llama_memory_seq_rm(mem, slot, int32_t(n), -1) || !holds_window(slot, n) ||
        llama_memory_seq_pos_max(mem, slot) != int32_t(n) - 1) {
        return false;
    }
    slots_[size_t(slot)].tokens.clear();
    seq.prefix.reset();
    seq.n_fed = n;
    seq.n_past = int32_t(n);
    seq.n_cached = int32_t(n);
    seq.state = SeqState::generating;
    seq.has_first = true;
    seq.t_first = Clock::now();
    take_token(seq, slot_logits_[size_t(slot)].data());
    return true;
}

}  // namespace lmsp
