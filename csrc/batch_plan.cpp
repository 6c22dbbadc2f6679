// Batch invariance (a sequence decoded alone or next to others gives the same
// logits bit for bit). Reading ggml-cpu shows these kernels whose summation
// order depends on the shape of the batch:
//  - llamafile's sgemm (CMakeLists.txt, GGML_LLAMAFILE=OFF) takes over
//    matmuls of two or more rows; one row goes through vec_dot, which
//    accumulates in another order. Kept off. Products of several rows of
//    q4_1, q5_0 and q8_0 weights take tiles instead (tile_matmul.cpp), which
//    give vec_dot's bits for every element.
//  - weight repacking (extra buffer types): repacked gemm (4+ rows) and gemv
//    (1 row) differ. Kept off.
//  - flash attention with K and V of one type (f16 here): a tiled kernel for
//    64+ query rows of a sequence in one ubatch, and a split-KV one
//    (per-thread partials) for a lone query over 512+ cells. The per-row
//    kernel skips masked cells and sums V in the V cache's precision (f16;
//    f32 for a bf16 cache). The tiled one sums
//    a row over 64-cell tiles of the sequence's own KV stream, where masked
//    cells add exact zeros, so each row it computes comes out the same
//    however many rows come with it, but not as the per-row kernel's.
//  - a tiled matmul for 8+ rows of K-quant and i-quant weights (q4_k, q6_k,
//    iq4_xs, ...; ggml-cpu/tiled), whose rows likewise come out the same for
//    any batch of 8 or more. On ARM and on x86 without AVX-512 VNNI the tiles
//    take q4_K and q6_K products of any rows instead, with vec_dot's bits
//    (tile_matmul.cpp); the others keep ggml's tiled matmul.
// So the engine computes each row in one of two fixed ways ("Two kinds of
// steps" below): a prompt of 64 tokens or more (8 or more on K-quant
// weights) is prefilled tiled, in steps of its own kind, in chunks of at
// least that many rows; every other row (decoding, shorter prompts, the
// generated tokens fed again on a resume) goes through one-row steps on
// ggml's reference kernels (llama_private.cpp), which take the per-row flash
// attention and vec_dot. They also fuse no ops, which changes no bits (the
// fused RMS norm multiplies as the two ops do) and no speed that llama-bench
// can tell on the tiny demo model. The tiled flash attention prefills that
// model's 86-token prompt in 2.0 ms instead of 3.7, and an 850-token one in
// 26 ms instead of 161 (llama-bench -fa 1 -ctk f16 --repack 0, -ctv f16
// against bf16, one thread). With batches under 128 rows (two of the
// smallest tiled chunks: a chunk leaves no shorter tail, so a step must hold
// up to twice the least) the V cache is bf16 instead, which keeps
// flash attention on its per-row kernel for every row (V to 8 significant
// bits, which shows as 7e-3 of the logits' scale against the numpy
// reference instead of 3e-3; tests/native). A MoE model with K-quant
// experts is not prefilled tiled: how many rows an expert gets depends on
// the whole batch, so every row takes the reference kernels.
// Each sequence also has its own KV stream (kv_unified=false), so its cells
// and positions do not depend on its neighbours (a unified cache only adds
// masked cells, whose zero weights leave the sums unchanged).
// Measured on the x86 AVX-512 machine of this project with the demo model
// (f32 and q8_0): with these settings logits are bitwise equal whatever the
// batch (eval_logits of a prefix versus the whole, tests/native), and tokens
// are equal alone and batched, and after resume. Turning llamafile, repacking
// or kv_unified back on, one at a time, did not change those results on that
// model: those are guards taken from the code. Flash attention's own paths
// did: with 2 threads, logits computed one row at a time over 700 cells
// differ from the same rows computed in 512-row batches (by up to 1.5e-2,
// from the second row on). The same invariance is what makes a resume
// without KV state (prefill of prompt+generated) exact.
// EngineOptions::batch_invariant = false gives this up on the CPU for speed:
// llama.cpp's kernels for every row wherever the batch allows them (tiled
// and split-KV flash attention, the tiled K-quant matmul, fused ops) and
// repacked weights, as its own tools run by default (serving the catalog
// models with AVX-512 it measured no faster: bench/README.md); a sequence's
// logits may then differ in the last bits with its neighbours in the batch,
// and a resume without KV state may continue differently from an
// uninterrupted run (what was already emitted never changes).
// GPU (LMSP_CUDA): kernels are chosen by batch size and are NOT batch
// invariant. Measured on an H200 (CUDA 13, sm_90): greedy tokens matched alone
// and batched, a sampled sequence diverged at its 36th token; resume (with and
// without KV) matched. Only the counter-based sampling is guaranteed there.

#include "batch_plan.h"

#include <algorithm>

#include "engine.h"
#include "gguf_info.h"

namespace lmsp {

// ---------------------------------------------------------------- kernels

// Whether the CPU backend multiplies by matrices of these ggml types one row
// at a time however many rows come (with llamafile and repacking off): the
// float and the legacy block types. Others (the K-quants and i-quants) have a
// tiled kernel for 8 or more rows, so an engine on them runs ggml's
// reference kernels instead (see the note above).
bool every_matmul_is_row_wise(const std::vector<int> & types) {
    for (const int t : types) {
        switch (ggml_type(t)) {
            case GGML_TYPE_F32:
            case GGML_TYPE_F16:
            case GGML_TYPE_BF16:
            case GGML_TYPE_Q8_0:
            case GGML_TYPE_Q4_0:
            case GGML_TYPE_Q4_1:
            case GGML_TYPE_Q5_0:
            case GGML_TYPE_Q5_1: break;
            default: return false;
        }
    }
    return true;
}

BatchPlan BatchPlan::for_weights(const EngineOptions & options, const GgufInfo & info) {
    // the kernels batch invariance keeps (see the note above)
    BatchPlan plan;
    const bool invariant_cpu = options.batch_invariant && options.n_gpu_layers == 0;
    plan.row_wise = every_matmul_is_row_wise(info.matrix_types);
    plan.moe_kquant = info.n_expert > 0 && !plan.row_wise;
    plan.fa_tiles = invariant_cpu && !plan.moe_kquant && size_t(options.n_batch) >= 2 * kFaTileRows;
    return plan;
}

void BatchPlan::set_model_params(llama_model_params & mp, const EngineOptions & options) const {
    mp.use_extra_bufts = !options.batch_invariant;  // repacked weights only without invariance (the note above)
}

void BatchPlan::set_context_params(llama_context_params & cp, const EngineOptions & options) const {
    if (options.n_gpu_layers == 0) {
        // CPU: flash attention; without tiled prompts, a bf16 V cache keeps it
        // on its per-row kernel (see the note above)
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
        cp.type_k = GGML_TYPE_F16;
        cp.type_v = options.batch_invariant && !fa_tiles ? GGML_TYPE_BF16 : GGML_TYPE_F16;
    } else {
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    cp.kv_unified = false;
    // with no layers on a GPU, keep every op on the CPU: a GPU build would
    // otherwise ship big batches' matmuls to the GPU and lose batch invariance
    cp.op_offload = options.n_gpu_layers != 0;
}

void BatchPlan::settle(bool invariant, const EngineOptions & options) {
    reference_kernels = invariant && !row_wise;
    matmul_tiles = reference_kernels && !moe_kquant && size_t(options.n_batch) >= 2 * kMinTiledRows;
    // with layers on RPC servers, a server tells the engine's tiled steps from
    // its one-row steps by their rows per sequence (rpc.cpp): one-row steps
    // take fewer than any tiled chunk
    one_row_cap = options.rpc_servers.empty() ? SIZE_MAX : kMinTiledRows - 1;
    run_rows_max = size_t(options.n_batch);
}

// ---------------------------------------------------------------- two kinds of steps

// Two kinds of steps, for batch invariance on the CPU (the note at the
// top): a tiled step prefills prompts of at least tiled_min() tokens, in
// chunks of at least that many rows (kFaTileRows for ggml's tiled flash
// attention, kMinTiledRows for its tiled K-quant matmul); every other row
// (decoding, shorter prompts, generated tokens fed again on a resume)
// goes through a one-row step on the reference kernels. Every row of a
// sequence is thus computed the same way whatever runs beside it. The
// sequences of a tiled step feed chunks of one length (see below), so
// its prompts are all of one kind; and since the last layer and the
// output matmul see only the rows whose logits are wanted, a tiled step
// on K-quant weights ends at most kMinTiledRows - 1 prompts. The two
// kinds take turns while both have work, with one exception: a run of
// tiled steps that began while nothing waited to decode goes on while the
// only streams waiting are those its own prompts started, up to n_batch
// rows. Prompts that arrive together (a burst of requests, a closed loop of
// clients whose answers ended in one step) thus start decoding in one step,
// as they would in one batch, instead of each new stream meeting the next
// prompt's tiled step between its first tokens; and streams that start
// together end together, so the next round arrives together again.

size_t BatchPlan::tiled_min(size_t n_prompt) const {
    // each kind is on only where a batch holds two of its smallest chunks:
    // the first prompt of a tiled step always advances
    if (fa_tiles && n_prompt >= kFaTileRows) return kFaTileRows;
    if (matmul_tiles && n_prompt >= kMinTiledRows) return kMinTiledRows;
    return 0;
}

bool BatchPlan::next_step_tiled(bool tiled_work, bool one_row_work) {
    bool tiled_step = false;
    if (tiled_work && (!one_row_work || !last_step_tiled)) {
        tiled_step = true;
    } else if (tiled_work) {
        // a run goes on while the streams that wait are its own, up to a batch of rows
        tiled_step = !run_waiting && run_rows < run_rows_max;
    }
    if (tiled_step && !last_step_tiled) {
        run_waiting = one_row_work;
        run_rows = 0;
    }
    last_step_tiled = tiled_step;
    return tiled_step;
}

size_t BatchPlan::step_chunk(size_t prefill_chunk) const {
    // a row's bits do not depend on its chunk (the tiles compute each row
    // alone, and every chunk is at least tiled_min rows), so the chunk may
    // follow the load: shorter while streams wait, so that each of them
    // waits for at most one short tiled step between two of its tokens
    return run_waiting ? std::min(prefill_chunk, kChunkWhileDecoding) : prefill_chunk;
}

size_t BatchPlan::tiled_chunk(TiledStep & step, size_t t_left, size_t m, size_t left, size_t prefill_chunk,
                              size_t room) const {
    size_t n = std::min({t_left, std::max(prefill_chunk, 2 * m), room});
    if (n < t_left && t_left - n < m) n = t_left - m;  // no short tail
    // no room this step
    if (n < m) return 0;
    if (step.chunk == 0) {
        step.chunk = n;
    } else {
        // llama.cpp cuts a batch of several sequences into ubatches that take
        // as many rows from each: with chunks of one length every ubatch holds
        // whole chunks, never a short remainder of one
        if (step.chunk < m || t_left < step.chunk || (t_left > step.chunk && t_left - step.chunk < m) ||
            room < step.chunk) {
            return 0;
        }
        n = step.chunk;
    }
    if (n == left) {
        if (reference_kernels && step.prompts_ended + 1 >= kMinTiledRows) return 0;
        step.prompts_ended++;
    }
    return n;
}

// ---------------------------------------------------------------- ubatches

void rows_by_sequence(const llama_batch & batch, SeqRows & out) {
    out.clear();
    for (int32_t k = 0; k < batch.n_tokens; ++k) {
        const int32_t seq = batch.seq_id[k][0];
        if (out.empty() || out.back().first != seq) out.emplace_back(seq, 0);
        out.back().second++;
    }
}

int64_t count_ubatches(const llama_batch & batch, int32_t n_ubatch, SeqRows & left) {
    rows_by_sequence(batch, left);
    return count_ubatches(left, n_ubatch);
}

// How many ubatches llama.cpp cuts a batch into when each sequence has a KV
// stream of its own (split_equal): from the lowest sequence with rows left,
// a run of consecutive sequence ids, as many rows from each as the one with
// the fewest has left and the ubatch holds; each ubatch is one pass over
// the weights.
int64_t count_ubatches(SeqRows & left, int32_t n_ubatch) {
    int64_t n = 0;
    for (;;) {
        size_t first = 0;
        while (first < left.size() && left[first].second == 0) ++first;
        if (first == left.size()) return n;
        size_t end = first + 1;
        int32_t rows = left[first].second;
        for (size_t prev = first, i = first + 1; i < left.size(); ++i) {
            if (left[i].second == 0) continue;
            if (left[i].first != left[prev].first + 1) break;
            rows = std::min(rows, left[i].second);
            end = i + 1;
            prev = i;
        }
        size_t n_seqs = 0;
        for (size_t i = first; i < end; ++i) n_seqs += left[i].second > 0;
        rows = std::max<int32_t>(1, std::min<int32_t>(rows, n_ubatch / int32_t(n_seqs)));
        for (size_t i = first; i < end; ++i) {
            if (left[i].second > 0) left[i].second -= rows;
        }
        n++;
    }
}

// ---------------------------------------------------------------- filler rows

// A free slot between two slots of a step splits their run of sequences
// into two ubatches: one more pass over the weights for every step until a
// new sequence takes that slot, which on a busy server is most steps (a
// sequence ends, the client sends its next request, the prompt is
// prefilled). A filler row, one token at the next position of the free
// slot's own KV stream with no logits, joins the runs again; the engine
// removes it from the cache after the step, which leaves the stream as it
// was (its cells are contiguous from 0: the row takes the cell at the head
// and gives it back). Each sequence has its own stream and each row its own
// kernels, so the other rows' logits do not change. What it costs and
// buys, in the engine alone (bench/ubatches.py, "layouts": SmolLM2, 2
// threads, short sequences): a filler row adds 2.2 ms to a step of two rows
// and 2.8-3.8 ms to one of sixteen; a second pass adds 2.6-3.0 ms to a step
// of two rows split 1 + 1, 8.2 ms to one of sixteen split 8 + 8. So one
// filler row pays for each pass it saves, two in a step of 8 rows or more.
size_t filler_rows_per_pass(size_t rows) { return rows >= 8 ? kMaxFillerRowsPerPass : 1; }

bool fillers_pay(const SeqRows & rows, int32_t n_ubatch, const std::vector<int32_t> & fillers, SeqRows & scratch) {
    scratch = rows;
    const int64_t before = count_ubatches(scratch, n_ubatch);
    scratch = rows;
    for (const int32_t s : fillers) scratch.emplace_back(s, 1);
    std::sort(scratch.begin(), scratch.end());
    const int64_t after = count_ubatches(scratch, n_ubatch);
    size_t rows_in_step = 0;
    for (const auto & r : rows) rows_in_step += size_t(r.second);
    return after < before && fillers.size() <= filler_rows_per_pass(rows_in_step) * size_t(before - after);
}

}  // namespace lmsp
