#include "chat_template.h"

#include <cctype>
#include <exception>
#include <mutex>
#include <utility>

#include "chat.h"
#include "errors.h"
#include "json.h"
#include "llama.h"
#include "log.h"
#include "peg-parser.h"

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

namespace {

common_chat_tool_choice tool_choice_of(const std::string & choice) {
    try {
        return common_chat_tool_choice_parse_oaicompat(choice);
    } catch (const std::exception &) {
        throw InvalidArgument("tool_choice must be auto, none or required, not '" + choice + "'");
    }
}

// The inputs of a request with tools, as llama-server makes them from a chat
// completion's body on its defaults.
common_chat_templates_inputs request_inputs(const ChatRequest & r, bool default_thinking) {
    common_chat_templates_inputs in;
    in.use_jinja = true;
    in.add_generation_prompt = r.add_generation_prompt;
    in.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
    in.enable_thinking = r.enable_thinking < 0 ? default_thinking : r.enable_thinking != 0;
    in.chat_template_kwargs["preserve_reasoning"] = "true";
    if (!r.reasoning_effort.empty())
        in.chat_template_kwargs["reasoning_effort"] = common_json(r.reasoning_effort).dump();
    in.tool_choice = tool_choice_of(r.tool_choice);
    in.parallel_tool_calls = r.parallel_tool_calls;
    try {
        in.messages = common_chat_msgs_parse_oaicompat(common_json::parse(r.messages_json));
        if (!r.tools_json.empty()) in.tools = common_chat_tools_parse_oaicompat(common_json::parse(r.tools_json));
        if (!r.json_schema.empty()) in.json_schema = common_json::parse(r.json_schema).dump();
    } catch (const std::exception & e) {
        throw InvalidArgument(std::string("the chat's messages or tools cannot be read: ") + e.what());
    }
    return in;
}

GrammarSpec grammar_of(const common_chat_params & p) {
    GrammarSpec g;
    g.gbnf = p.grammar;
    g.lazy = p.grammar_lazy;
    g.preserved = p.preserved_tokens;
    g.prefill = p.generation_prompt;
    for (const auto & t : p.grammar_triggers) {
        GrammarTrigger trig;
        trig.value = t.value;
        trig.token = t.token;
        switch (t.type) {
            case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN: trig.kind = GrammarTrigger::Kind::token; break;
            case COMMON_GRAMMAR_TRIGGER_TYPE_WORD: trig.kind = GrammarTrigger::Kind::word; break;
            case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN: trig.kind = GrammarTrigger::Kind::pattern; break;
            case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: trig.kind = GrammarTrigger::Kind::pattern_full; break;
        }
        g.triggers.push_back(std::move(trig));
    }
    return g;
}

}  // namespace

ChatRender ChatTemplate::render(const ChatRequest & request) const {
    const common_chat_templates_inputs in = request_inputs(request, impl_->enable_thinking);
    common_chat_params p;
    try {
        p = common_chat_templates_apply(impl_->templates.get(), in);
    } catch (const std::exception & e) {
        throw InvalidArgument(std::string("the model's chat template refused the request: ") + e.what());
    }
    ChatRender out;
    out.prompt = std::move(p.prompt);
    out.format = int(p.format);
    out.format_name = common_chat_format_name(p.format);
    out.grammar = grammar_of(p);
    out.additional_stops = std::move(p.additional_stops);
    out.generation_prompt = std::move(p.generation_prompt);
    out.parser = std::move(p.parser);
    out.supports_thinking = p.supports_thinking;
    out.thinking_start = std::move(p.thinking_start_tag);
    out.thinking_end = std::move(p.thinking_end_tags);
    return out;
}

std::map<std::string, bool> ChatTemplate::caps() const {
    return common_chat_templates_get_caps(impl_->templates.get());
}

bool ChatTemplate::supports_thinking() const { return impl_->enable_thinking; }

struct ChatParser::Impl {
    common_chat_parser_params params;
};

ChatParser::ChatParser(int format, const std::string & generation_prompt, const std::string & parser)
    : impl_(std::make_unique<Impl>()) {
    if (format < 0 || format >= int(COMMON_CHAT_FORMAT_COUNT)) throw InvalidArgument("unknown chat format");
    impl_->params.format = common_chat_format(format);
    impl_->params.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
    impl_->params.generation_prompt = generation_prompt;
    if (!parser.empty()) {
        try {
            impl_->params.parser.load(parser);
        } catch (const std::exception & e) {
            throw InvalidArgument(std::string("not a chat output parser: ") + e.what());
        }
    }
}

ChatParser::~ChatParser() = default;

ChatParsed ChatParser::parse(const std::string & text, bool partial) const {
    common_chat_msg msg;
    try {
        msg = common_chat_parse(text, partial, impl_->params);
    } catch (const std::exception & e) {
        throw InvalidArgument(std::string("the output does not match the chat format: ") + e.what());
    }
    ChatParsed out;
    out.content = msg.render_content();
    out.reasoning = std::move(msg.reasoning_content);
    for (auto & c : msg.tool_calls)
        out.tool_calls.push_back({std::move(c.name), std::move(c.arguments), std::move(c.id)});
    return out;
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
