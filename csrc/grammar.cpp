#include "grammar.h"

#include <cctype>
#include <cmath>
#include <exception>

#include "common.h"
#include "errors.h"
#include "json-schema-to-grammar.h"
#include "json.h"
#include "llama.h"
#include "llama_private.h"

namespace lmsp {

namespace {

std::vector<int32_t> special_tokens(const llama_vocab * vocab, const std::string & text) {
    return common_tokenize(vocab, text, false, true);
}

// The trigger patterns and tokens of a lazy grammar, as llama-server makes
// them: a word that is one preserved special token triggers on that token.
void lazy_triggers(const llama_vocab * vocab, const GrammarSpec & spec, const std::set<int32_t> & preserved,
                   std::vector<std::string> & patterns, std::vector<llama_token> & tokens) {
    for (const auto & t : spec.triggers) {
        switch (t.kind) {
            case GrammarTrigger::Kind::word: {
                const auto ids = special_tokens(vocab, t.value);
                if (ids.size() == 1 && preserved.count(ids[0])) {
                    tokens.push_back(ids[0]);
                } else {
                    patterns.push_back(regex_escape(t.value));
                }
                break;
            }
            case GrammarTrigger::Kind::pattern: patterns.push_back(t.value); break;
            case GrammarTrigger::Kind::pattern_full: {
                std::string anchored = "^$";
                if (!t.value.empty()) {
                    anchored = (t.value.front() != '^' ? "^" : "") + t.value + (t.value.back() != '$' ? "$" : "");
                }
                patterns.push_back(anchored);
                break;
            }
            case GrammarTrigger::Kind::token: tokens.push_back(t.token); break;
        }
    }
}

std::string pieces(const llama_vocab * vocab, const std::vector<int32_t> & tokens, size_t from = 0) {
    std::string out;
    for (size_t i = from; i < tokens.size(); ++i) out += common_token_to_piece(vocab, tokens[i], true);
    return out;
}

// The tokens of a prefill, as the prompt holds it. A tokenizer that puts a
// space before a text (SentencePiece) may glue it to the first piece (" <"):
// after a newline, the text starts a piece of its own, and the tokens of the
// newline are left out. Otherwise, as llama.cpp's common sampler does, a
// first token that is a space the text does not have is left out.
std::vector<int32_t> prefill_tokens(const llama_vocab * vocab, const std::string & text) {
    std::vector<int32_t> tokens = special_tokens(vocab, text);
    if (tokens.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return tokens;
    const std::string first = common_token_to_piece(vocab, tokens[0], true);
    if (first.empty() || !std::isspace(static_cast<unsigned char>(first[0]))) return tokens;
    if (first.size() > 1) {
        const std::vector<int32_t> after = special_tokens(vocab, "\n" + text);
        std::string lead;
        for (size_t i = 0; i < after.size() && lead.size() < 2; ++i) {
            lead += common_token_to_piece(vocab, after[i], true);
            if ((lead == "\n" || lead == " \n") && pieces(vocab, after, i + 1) == text) {
                return std::vector<int32_t>(after.begin() + long(i) + 1, after.end());
            }
        }
    }
    tokens.erase(tokens.begin());
    return tokens;
}

// The digits at `i` as a number (at most 18 of them, more is out of reach anyway), `i` past them.
uint64_t read_count(const std::string & s, size_t & i) {
    uint64_t n = 0;
    for (int digits = 0; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) {
        if (++digits <= 18) n = n * 10 + uint64_t(s[i] - '0');
    }
    return n;
}

void skip_spaces(const std::string & s, size_t & i) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
}

// Throws InvalidArgument for a repetition {m,n} with n < m outside the
// grammar's literals, character classes and comments.
void check_repetitions(const std::string & gbnf) {
    for (size_t i = 0; i < gbnf.size(); ++i) {
        const char c = gbnf[i];
        if (c == '"' || c == '[') {  // a literal or a class: to its unescaped end
            const char end = c == '"' ? '"' : ']';
            for (++i; i < gbnf.size() && gbnf[i] != end; ++i) {
                if (gbnf[i] == '\\') ++i;
            }
        } else if (c == '#') {
            while (i < gbnf.size() && gbnf[i] != '\n') ++i;
        } else if (c == '{') {
            size_t j = i + 1;
            skip_spaces(gbnf, j);
            const uint64_t low = read_count(gbnf, j);
            skip_spaces(gbnf, j);
            if (j >= gbnf.size() || gbnf[j] != ',') continue;
            ++j;
            skip_spaces(gbnf, j);
            if (j >= gbnf.size() || !std::isdigit(static_cast<unsigned char>(gbnf[j]))) continue;
            const uint64_t high = read_count(gbnf, j);
            skip_spaces(gbnf, j);
            if (high < low) {
                const size_t end = j < gbnf.size() && gbnf[j] == '}' ? j + 1 : j;
                throw InvalidArgument("the grammar repeats " + gbnf.substr(i, end - i) +
                                      ": fewer times at most than at least");
            }
        }
    }
}

}  // namespace

Grammar::Grammar(const llama_vocab * vocab, const GrammarSpec & spec) {
    if (spec.gbnf.empty()) throw InvalidArgument("grammar must not be empty");
    check_repetitions(spec.gbnf);
    for (const auto & text : spec.preserved) {
        const auto ids = special_tokens(vocab, text);
        if (ids.size() == 1) preserved_.insert(ids[0]);
    }
    if (spec.lazy) {
        std::vector<std::string> patterns;
        std::vector<llama_token> tokens;
        lazy_triggers(vocab, spec, preserved_, patterns, tokens);
        if (patterns.empty() && tokens.empty()) throw InvalidArgument("a lazy grammar needs at least one trigger");
        std::vector<const char *> c_patterns;
        for (const auto & p : patterns) c_patterns.push_back(p.c_str());
        try {
            sampler_ = llama_sampler_init_grammar_lazy_patterns(vocab, spec.gbnf.c_str(), "root", c_patterns.data(),
                                                                c_patterns.size(), tokens.data(), tokens.size());
        } catch (const std::exception & e) {  // a trigger pattern that is no regular expression
            throw InvalidArgument(std::string("grammar trigger: ") + e.what());
        }
    } else {
        sampler_ = llama_sampler_init_grammar(vocab, spec.gbnf.c_str(), "root");
    }
    if (sampler_ == nullptr) throw InvalidArgument("the grammar does not parse (GBNF with a 'root' rule)");
    if (!spec.lazy && !spec.prefill.empty()) {
        for (const int32_t token : prefill_tokens(vocab, spec.prefill)) {
            if (!accept(token)) throw InvalidArgument("the grammar does not take the prompt's opening of the output");
        }
    }
}

Grammar::~Grammar() {
    if (sampler_ != nullptr) llama_sampler_free(sampler_);
}

bool Grammar::allows(int32_t token) {
    llama_token_data one = {token, 1.0f, 0.0f};
    llama_token_data_array arr = {&one, 1, -1, false};
    llama_sampler_apply(sampler_, &arr);
    return arr.data[0].logit != -INFINITY;
}

void Grammar::mask(const float * logits, int32_t n_vocab, std::vector<float> & out) {
    static thread_local std::vector<llama_token_data> cands;  // the engine thread's scratch
    cands.resize(size_t(n_vocab));
    for (int32_t i = 0; i < n_vocab; ++i) cands[size_t(i)] = {i, logits[i], 0.0f};
    llama_token_data_array arr = {cands.data(), cands.size(), -1, false};
    llama_sampler_apply(sampler_, &arr);
    out.resize(size_t(n_vocab));
    for (size_t i = 0; i < arr.size; ++i) out[size_t(arr.data[i].id)] = arr.data[i].logit;
}

bool Grammar::accept(int32_t token) {
    try {
        llama_sampler_accept(sampler_, token);
        return true;
    } catch (const std::exception &) {  // llama.cpp's grammar throws on a token it cannot take
        return false;
    }
}

void check_grammar(const std::string & gbnf) {
    check_repetitions(gbnf);
    if (!grammar_parses(gbnf.c_str())) {
        throw InvalidArgument("the grammar does not parse, or a rule of it begins with itself");
    }
}

std::string schema_grammar(const std::string & schema_json) {
    common_json schema;
    try {
        schema = common_json::parse(schema_json);
    } catch (const std::exception & e) {
        throw InvalidArgument(std::string("the schema is not JSON: ") + e.what());
    }
    try {
        return json_schema_to_grammar(schema);
    } catch (const std::exception & e) {
        throw InvalidArgument(std::string("the schema cannot be expressed as a grammar: ") + e.what());
    }
}

}  // namespace lmsp
