#include "slot_choice.h"

#include <algorithm>

namespace lmsp {

// The free slot whose KV, left by a sequence of the same ``key``, holds the
// longest prefix of ``tokens`` (``common`` of them), if that prefix is the
// whole prompt (a request made again: first a slot that kept the logits of
// its last row), most of what the slot holds (a conversation's next turn)
// or long in itself (a shared system message).
// Else an empty slot (the lowest), else the one freed longest ago, whose
// cache is the least likely to be asked for again: a prompt that shares only a chat
// template's opening with a slot's conversation does not evict it. The key
// keeps one client's prompts from being found, or timed, by another.
int pick_slot(const std::vector<Slot> & slots, const std::vector<int32_t> * tokens, const std::string & key,
              size_t & common) {
    constexpr size_t kLongPrefix = 256;
    int hit = -1, spare = -1;
    bool hit_whole = false;  // the hit kept the logits of the whole of `tokens`
    common = 0;
    // llama.cpp decodes a run of consecutive slots in one ubatch, each further
    // run being one more pass over the weights: first a slot between two
    // running sequences (two runs become one), then one beside a running one
    auto running_beside = [&slots](size_t i) {
        return int(i > 0 && slots[i - 1].used) + int(i + 1 < slots.size() && slots[i + 1].used);
    };
    auto sooner = [&](size_t a, size_t b) {  // the better slot to give up: joining runs, empty, oldest
        const int ra = running_beside(a), rb = running_beside(b);
        if (ra != rb) return ra > rb;
        const bool ea = slots[a].tokens.empty(), eb = slots[b].tokens.empty();
        if (ea != eb) return ea;
        // of two empty slots the lower: with nothing cached to keep, the running
        // sequences stay packed at the low end instead of spreading over every slot
        return ea ? a < b : slots[a].freed_at < slots[b].freed_at;
    };
    for (size_t i = 0; i < slots.size(); ++i) {
        if (slots[i].used) continue;
        if (spare < 0 || sooner(i, size_t(spare))) spare = int(i);
        if (tokens == nullptr || slots[i].key != key) continue;
        const auto & held = slots[i].tokens;
        const size_t limit = std::min(held.size(), tokens->size());
        size_t n = 0;
        while (n < limit && held[n] == (*tokens)[n]) n++;
        const bool whole = n + 1 >= tokens->size();
        if (n == 0 || !(whole || 2 * n >= held.size() || n >= kLongPrefix)) continue;
        const bool kept = n == tokens->size() && slots[i].logits_rows == n;
        const bool older = hit >= 0 && slots[i].freed_at < slots[size_t(hit)].freed_at;
        if (hit < 0 || n > common || (n == common && (kept != hit_whole ? kept : older))) {
            hit = int(i);
            common = n;
            hit_whole = kept;
        }
    }
    return hit >= 0 ? hit : spare;
}

// How many leading positions of a slot's KV a new sequence may take over
// when rows are computed in two ways (tiled prefill, one-row decode): up to
// `common`, where each row was computed the way a prefill of the new
// sequence would compute it (the first `t_slot` rows of the slot tiled in
// chunks of at least `m_slot`, the first `t_new` of the new sequence in
// chunks of at least `m_new`), leaving its tiled rows 0 or at least `m_new`
// to prefill.
size_t same_kind_prefix(size_t common, size_t t_slot, size_t m_slot, size_t t_new, size_t m_new) {
    if (t_slot > 0 && t_new > 0 && m_slot != m_new) return 0;  // tiled in two ways from the first row
    if (t_slot != t_new) common = std::min(common, std::min(t_slot, t_new));
    if (t_new > common && t_new - common < m_new) common = t_new - m_new;
    return common;
}

size_t usable_rows(size_t common, size_t n_feed, bool two_kinds, size_t t_held, size_t m_held, size_t t_new,
                   size_t m_new) {
    if (common == 0 || n_feed == 0) return 0;
    common = std::min(common, n_feed - 1);
    if (two_kinds) common = same_kind_prefix(common, t_held, m_held, t_new, m_new);
    return common;
}

}  // namespace lmsp
