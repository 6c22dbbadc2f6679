#include "chat_template.h"

#include <cctype>
#include <exception>
#include <mutex>
#include <utility>

#include "chat.h"
#include "errors.h"
#include "llama.h"
#include "log.h"

namespace lmsp {

struct ChatTemplate::Impl {
    common_chat_templates_ptr templates;
    bool enable_thinking = false;
};

namespace {

// llama.cpp's common library logs through a thread of its own to stdout; the
// module reports through exceptions instead.
void quiet_common_log() {
    static std::once_flag once;
    std::call_once(once, [] { common_log_set_verbosity_thold(-1); });
}

// What llama-server puts in its template inputs on its defaults: Jinja, the
// DeepSeek reasoning format, thinking on where the template has it, and the
// preserve_reasoning keyword set.
common_chat_templates_inputs server_inputs(const std::vector<ChatMessage> & messages, bool add_generation_prompt,
                                           bool enable_thinking) {
    common_chat_templates_inputs in;
    in.use_jinja = true;
    in.add_generation_prompt = add_generation_prompt;
    in.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
    in.enable_thinking = enable_thinking;
    in.chat_template_kwargs["preserve_reasoning"] = "true";
    in.messages.reserve(messages.size());
    for (const auto & m : messages) {
        common_chat_msg msg;
        msg.role = m.role;
        msg.content = m.content;
        in.messages.push_back(std::move(msg));
    }
    return in;
}

}  // namespace

ChatTemplate::ChatTemplate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ChatTemplate::~ChatTemplate() = default;

std::unique_ptr<ChatTemplate> ChatTemplate::from_model(const llama_model * model) {
    if (llama_model_chat_template(model, nullptr) == nullptr &&
        llama_model_chat_template(model, "tool_use") == nullptr) {
        return nullptr;  // llama-server would fall back to ChatML here; see plain_prompt
    }
    quiet_common_log();
    auto impl = std::make_unique<Impl>();
    try {
        impl->templates = common_chat_templates_init(model, "");
    } catch (const std::exception & e) {
        throw ModelFormatError(std::string("the model's chat template does not parse: ") + e.what());
    }
    // as llama-server decides it at start: thinking is on where the template knows it
    try {
        impl->enable_thinking = common_chat_templates_support_enable_thinking(impl->templates.get());
    } catch (const std::exception &) {
        impl->enable_thinking = false;
    }
    return std::unique_ptr<ChatTemplate>(new ChatTemplate(std::move(impl)));
}

std::string ChatTemplate::apply(const std::vector<ChatMessage> & messages, bool add_generation_prompt) const {
    common_chat_templates_inputs in = server_inputs(messages, add_generation_prompt, impl_->enable_thinking);
    try {
        return common_chat_templates_apply(impl_->templates.get(), in).prompt;
    } catch (const std::exception &) {
        // Besides the prompt, llama-server derives a parser for the model's
        // output from the template, and fails the request when it cannot.
        // The prompt itself is the template's direct rendering: a failure
        // there is the template refusing the messages.
    }
    in.force_pure_content = true;
    try {
        return common_chat_templates_apply(impl_->templates.get(), in).prompt;
    } catch (const std::exception & e) {
        throw InvalidArgument(std::string("the model's chat template refused the messages: ") + e.what());
    }
}

std::string plain_prompt(const std::vector<ChatMessage> & messages, bool add_generation_prompt) {
    std::string out;
    for (const auto & m : messages) {
        std::string role = m.role;
        if (!role.empty()) role[0] = char(std::toupper(static_cast<unsigned char>(role[0])));
        out += role + ": " + m.content + "\n\n";
    }
    if (add_generation_prompt) out += "Assistant:";
    return out;
}

}  // namespace lmsp
