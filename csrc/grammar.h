// Grammar-constrained sampling: llama.cpp's grammar sampler (GBNF, optionally
// lazy) beside the service's counter-based Sampler. The sampler's own pick is
// tried first; only when the grammar rejects it is the whole vocabulary
// masked and a second, independent draw made on what the grammar allows, as
// llama.cpp's common sampler does (a sequence with log probabilities has it
// masked at every step: they are reported over the allowed tokens).
// End-of-generation tokens pass only where the grammar is complete.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

struct llama_sampler;
struct llama_vocab;

namespace lmsp {

// The error code of a constrained sequence whose grammar allows no next token.
inline constexpr const char * kGrammarDeadEnd = "grammar_dead_end";

// What starts a lazy grammar (common_grammar_trigger's kinds).
struct GrammarTrigger {
    enum class Kind { word, pattern, pattern_full, token } kind = Kind::word;
    std::string value;   // the word, or the regular expression
    int32_t token = -1;  // Kind::token
};

struct GrammarSpec {
    std::string gbnf;  // its start rule is "root"
    // lazy: the output is free until a trigger appears, then the grammar holds
    bool lazy = false;
    std::vector<GrammarTrigger> triggers;
    // special tokens whose text the output keeps (a tool call's markers)
    std::vector<std::string> preserved;
    // text the prompt already opened the output with (a chat format's
    // generation prompt): accepted by a grammar that is not lazy first
    std::string prefill;
};

class Grammar {
public:
    // Throws InvalidArgument when the grammar does not parse, repeats something
    // fewer times at most than at least ({5,2}: llama.cpp's parser would not
    // end), or a trigger is not usable.
    Grammar(const llama_vocab * vocab, const GrammarSpec & spec);
    ~Grammar();
    Grammar(const Grammar &) = delete;
    Grammar & operator=(const Grammar &) = delete;

    // Whether `token` may come next.
    bool allows(int32_t token);
    // `logits` with every token the grammar rejects set to -inf, into `out`.
    void mask(const float * logits, int32_t n_vocab, std::vector<float> & out);
    // `token` taken as the next one; false when the grammar does not take it.
    bool accept(int32_t token);
    // Whether the output keeps this special token's text.
    bool preserved(int32_t token) const { return preserved_.count(token) != 0; }

private:
    llama_sampler * sampler_ = nullptr;
    std::set<int32_t> preserved_;
};

// Throws InvalidArgument for GBNF text that the grammar sampler would refuse
// (Grammar's constructor): one that does not parse, repeats something fewer
// times at most than at least, or has a left-recursive rule.
void check_grammar(const std::string & gbnf);

// The GBNF grammar of the texts a JSON schema admits (llama.cpp's
// json-schema-to-grammar). Throws InvalidArgument for text that is not JSON
// and for a schema the converter cannot express.
std::string schema_grammar(const std::string & schema_json);

}  // namespace lmsp
