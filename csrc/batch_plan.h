// The batch plan: the kernels that compute each row of a batch, kept so that a
// sequence's logits do not depend on what runs beside it (batch invariance),
// and the two kinds of steps that follow from them. Why, and what was
// measured: batch_plan.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "llama.h"

namespace lmsp {

struct EngineOptions;  // engine.h
struct GgufInfo;       // gguf_info.h

// ggml's tiled matmul takes 8 rows or more; each row it computes comes out the
// same however many there are. Fewer take the one-row path.
constexpr size_t kMinTiledRows = 8;
// ggml's tiled flash attention takes 64 query rows of a sequence or more.
constexpr size_t kFaTileRows = 64;
// A tiled step's chunk of a prompt while other sequences wait to decode, at
// most: the stall a running stream sees while a long prompt is prefilled.
constexpr size_t kChunkWhileDecoding = 2 * kFaTileRows;

// Whether the CPU backend multiplies by matrices of these ggml types one row
// at a time however many rows come (with llamafile and repacking off).
bool every_matmul_is_row_wise(const std::vector<int> & types);

// The rows of each sequence of a batch sorted by sequence: (sequence, rows), ascending.
using SeqRows = std::vector<std::pair<int32_t, int32_t>>;
void rows_by_sequence(const llama_batch & batch, SeqRows & out);

// How many ubatches llama.cpp cuts a batch sorted by sequence into (each one
// pass over the weights); `left` is scratch space.
int64_t count_ubatches(const llama_batch & batch, int32_t n_ubatch, SeqRows & left);
int64_t count_ubatches(SeqRows & left, int32_t n_ubatch);  // counts down `left`

// At most this many filler rows between two runs of slots (batch_plan.cpp,
// "Filler rows"), and for each pass over the weights they save.
constexpr size_t kMaxFillerRowsPerPass = 2;
size_t filler_rows_per_pass(size_t rows);  // in a step of `rows` rows

// Whether the filler rows of `fillers` save passes enough for their rows.
bool fillers_pay(const SeqRows & rows, int32_t n_ubatch, const std::vector<int32_t> & fillers, SeqRows & scratch);

// The free sequences (slots) whose filler row would join runs of the batch's
// sequences (`rows`) into fewer ubatches, worth their rows; none when no such
// rows are. `fillable(seq)`: whether that sequence can take one.
template <class Fillable>
void filler_sequences(const SeqRows & rows, int32_t n_ubatch, Fillable fillable, std::vector<int32_t> & out,
                      SeqRows & scratch) {
    out.clear();
    for (size_t i = 1; i < rows.size(); ++i) {
        const int32_t from = rows[i - 1].first + 1, to = rows[i].first;  // the gap [from, to)
        if (to == from || size_t(to - from) > kMaxFillerRowsPerPass) continue;
        bool all = true;
        for (int32_t s = from; s < to && all; ++s) all = fillable(s);
        if (!all) continue;
        for (int32_t s = from; s < to; ++s) out.push_back(s);
    }
    if (!out.empty() && !fillers_pay(rows, n_ubatch, out, scratch)) out.clear();
}

// A tiled step as its prompts are added: the chunk length each takes, and how
// many prompts end in it.
struct TiledStep {
    size_t chunk = 0;  // 0: no prompt yet
    size_t prompts_ended = 0;
};

// Batch invariance on the CPU computes each row one of two ways: one-row
// steps on ggml's reference kernels, and prompts prefilled by ggml's tiled
// kernels in steps of their own, in chunks of at least tiled_min(prompt
// length) rows (0: the prompt goes through one-row steps).
struct BatchPlan {
    bool reference_kernels = false;  // K-quant or i-quant weights decode on ggml's one-row kernels
    bool fa_tiles = false;           // prompts of 64+ tokens: tiled flash attention (K and V f16)
    bool matmul_tiles = false;       // prompts of 8+ tokens: tiled K-quant matmul
    bool row_wise = true;            // every matmul of the weights takes one row at a time
    bool moe_kquant = false;         // experts on K-quant or i-quant weights
    bool last_step_tiled = false;
    bool run_waiting = false;       // streams waited to decode when this run of tiled steps began
    size_t run_rows = 0;            // rows the tiled steps of this run took
    size_t run_rows_max = 0;        // rows a run takes while only its own new streams wait
    size_t one_row_cap = SIZE_MAX;  // rows of a sequence in a one-row step, at most

    // Before the model loads: what its weights allow.
    static BatchPlan for_weights(const EngineOptions & options, const GgufInfo & info);
    void set_model_params(llama_model_params & mp, const EngineOptions & options) const;
    void set_context_params(llama_context_params & cp, const EngineOptions & options) const;
    // Once the context is made: `invariant` when batch invariance holds (the CPU backend, asked for).
    void settle(bool invariant, const EngineOptions & options);

    // one-row steps run the reference kernels
    bool one_row_reference() const { return reference_kernels || fa_tiles; }
    bool two_kinds() const { return fa_tiles || matmul_tiles; }
    size_t tiled_min(size_t n_prompt) const;
    // Whether the next step is a tiled one, given the work of each kind.
    bool next_step_tiled(bool tiled_work, bool one_row_work);
    // A tiled step took `rows` rows.
    void took_tiled_rows(size_t rows) { run_rows += rows; }
    // The chunk a tiled step takes of a prompt: `prefill_chunk`, or at most
    // kChunkWhileDecoding while streams of before its run wait to decode.
    size_t step_chunk(size_t prefill_chunk) const;
    // The rows a prompt feeds into a tiled step (0: none this step), with
    // `t_left` rows of it left to prefill tiled in chunks of at least `m`,
    // `left` rows left in all, and `room` rows free in the batch.
    size_t tiled_chunk(TiledStep & step, size_t t_left, size_t m, size_t left, size_t prefill_chunk, size_t room) const;
};

}  // namespace lmsp
