// GGUF metadata without the weights: what the model registry shows and what
// the engine checks before it hands a file to llama.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lmsp {

struct GgufInfo {
    std::string architecture;
    std::optional<std::string> name;
    uint64_t parameters = 0;
    std::string quantization;  // "F32", "F16", "Q8_0", "Q4_K_M", ...
    uint64_t context_length = 0;
    std::optional<std::string> chat_template;
    uint64_t vocab_size = 0;
    uint64_t n_embd = 0;
    uint64_t n_layer = 0;
    uint64_t n_head = 0;
    uint64_t n_head_kv = 0;
    uint64_t tensor_count = 0;
    uint64_t size_bytes = 0;
    // A WordPiece (BERT) tokenizer that strips accents: it decomposes text
    // (NFD) first. llama.cpp's decomposition leaves Hangul syllables whole,
    // so whoever tokenizes text for such a model decomposes it in full first.
    bool decomposes_text = false;

    // Not shown to Python: why llama.cpp would abort (not throw) on this
    // file's hyperparameters; empty when they are within its limits.
    std::string unloadable;
    // Not shown to Python: the ggml types of the matrices (tensors of two or
    // more dimensions), each once.
    std::vector<int> matrix_types;
    // Not shown to Python: experts per MoE layer (0 for a dense model).
    uint64_t n_expert = 0;
};

// Reads the header with ggml's GGUF reader (no tensor data is loaded) and
// checks that every tensor's data lies inside the file. Throws FileMissing,
// ModelFormatError (wrong magic, truncated, corrupt, absurd counts) or
// OutOfMemory; never aborts the process on a hostile file.
GgufInfo read_gguf_info(const std::string & path);

}  // namespace lmsp
