// Chat prompts as the model's own chat template makes them: the GGUF's
// tokenizer.chat_template rendered by llama.cpp's Jinja engine (common/chat.h),
// with the inputs llama-server gives it when run with --jinja and its default
// options. A model without a template gets a plain format instead.
#pragma once

#include <memory>
#include <string>
#include <vector>

struct llama_model;

namespace lmsp {

struct ChatMessage {
    std::string role;  // "system", "user" or "assistant"
    std::string content;
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

private:
    struct Impl;
    explicit ChatTemplate(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

// For a model without a chat template: "System: ...\n\nUser: ...\n\n" and so
// on, one paragraph per message, and with add_generation_prompt a final
// "Assistant:".
std::string plain_prompt(const std::vector<ChatMessage> & messages, bool add_generation_prompt);

}  // namespace lmsp
