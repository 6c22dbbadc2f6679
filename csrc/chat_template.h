// Chat prompts as the model's own chat template makes them: the GGUF's
// tokenizer.chat_template rendered by llama.cpp's Jinja engine (common/chat.h),
// with the inputs llama-server gives it when run with --jinja and its default
// options. A model without a template gets a plain format instead.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "grammar.h"

struct llama_model;

namespace lmsp {

struct ChatMessage {
    std::string role;  // "system", "user" or "assistant"
    std::string content;
};

// A chat as llama-server renders it with --jinja for a model whose template
// knows tools: OpenAI-style messages and function tools, as JSON text.
struct ChatRequest {
    // [{"role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content"}]
    std::string messages_json;
    // [{"type": "function", "function": {"name", "description", "parameters"}}]; "" for none
    std::string tools_json;
    std::string tool_choice = "auto";  // auto, none or required
    bool parallel_tool_calls = false;
    std::string json_schema;       // the output's JSON schema; "" for none
    int enable_thinking = -1;      // -1: as llama-server decides it (on where the template has it)
    std::string reasoning_effort;  // for a template that reads it (low, medium, high); "" for none
    bool add_generation_prompt = true;
};

// What the chat layer makes of a ChatRequest (common_chat_params): the
// prompt, the grammar that holds the output to the model's call format (and
// to the tools' schemas), and the parser of that output.
struct ChatRender {
    std::string prompt;
    int format = 0;  // common_chat_format
    std::string format_name;
    GrammarSpec grammar;  // gbnf "" for none; prefill: the generation prompt
    std::vector<std::string> additional_stops;
    std::string generation_prompt;  // the prompt's end that the parser reads as the output's start
    std::string parser;             // the output's parser, serialized (common_peg_arena)
    bool supports_thinking = false;
    std::string thinking_start;
    std::vector<std::string> thinking_end;
};

struct ChatToolCall {
    std::string name;
    std::string arguments;  // JSON text (partial while the output is)
    std::string id;         // "" unless the format writes one
};

// An output as the chat layer's parser reads it.
struct ChatParsed {
    std::string content;
    std::string reasoning;
    std::vector<ChatToolCall> tool_calls;
};

class ChatTemplate {
public:
    // The model's template (tokenizer.chat_template, or its "tool_use"
    // variant when that is the only one); nullptr when it declares none.
    // Throws ModelFormatError when the template does not parse.
    static std::unique_ptr<ChatTemplate> from_model(const llama_model * model);
    ~ChatTemplate();
    ChatTemplate(const ChatTemplate &) = delete;
    ChatTemplate & operator=(const ChatTemplate &) = delete;

    // The prompt text, before tokenization: a leading BOS (trailing EOS) the
    // template writes itself is dropped when the tokenizer adds one, as
    // llama-server does. Throws InvalidArgument when the template refuses
    // the messages (a raise_exception in it, say). Safe from any thread.
    std::string apply(const std::vector<ChatMessage> & messages, bool add_generation_prompt) const;

    // The chat layer's rendering of a request with tools, a schema and the
    // thinking switch (common_chat_templates_apply). Throws InvalidArgument
    // for messages or tools it cannot read, or that the template refuses.
    ChatRender render(const ChatRequest & request) const;
    // What the template does (common_chat_templates_get_caps): supports_tools,
    // supports_tool_calls, supports_parallel_tool_calls, ...
    std::map<std::string, bool> caps() const;
    // Whether the template has a thinking switch (enable_thinking).
    bool supports_thinking() const;

private:
    struct Impl;
    explicit ChatTemplate(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

// The parser of one output (ChatRender's format, generation prompt and parser).
class ChatParser {
public:
    // Throws InvalidArgument when `parser` is not a serialized parser.
    ChatParser(int format, const std::string & generation_prompt, const std::string & parser);
    ~ChatParser();
    ChatParser(const ChatParser &) = delete;
    ChatParser & operator=(const ChatParser &) = delete;

    // `text` (the output so far, or all of it when !partial) read by the
    // parser. Throws InvalidArgument when a whole output does not match it.
    ChatParsed parse(const std::string & text, bool partial) const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// For a model without a chat template: "System: ...\n\nUser: ...\n\n" and so
// on, one paragraph per message, and with add_generation_prompt a final
// "Assistant:".
std::string plain_prompt(const std::vector<ChatMessage> & messages, bool add_generation_prompt);

}  // namespace lmsp
