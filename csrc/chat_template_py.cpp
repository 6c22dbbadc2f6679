// pybind11 glue of the chat layer (chat_template.h): a model's template with
// tools, and the parser of its output; bindings.cpp holds the rest of the module.
#include "chat_template_py.h"

#include <pybind11/stl.h>

#include "chat_template.h"
#include "errors.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

const char * trigger_kind(lmsp::GrammarTrigger::Kind kind) {
    switch (kind) {
        case lmsp::GrammarTrigger::Kind::word: return "word";
        case lmsp::GrammarTrigger::Kind::pattern: return "pattern";
        case lmsp::GrammarTrigger::Kind::pattern_full: return "pattern_full";
        case lmsp::GrammarTrigger::Kind::token: return "token";
    }
    return "word";
}

// The grammar as the engine's submit takes it (None: none).
py::object grammar_dict(const lmsp::GrammarSpec & g) {
    if (g.gbnf.empty()) return py::none();
    py::list triggers;
    for (const auto & t : g.triggers) {
        py::dict d("type"_a = trigger_kind(t.kind), "value"_a = t.value);
        if (t.kind == lmsp::GrammarTrigger::Kind::token) d["token"] = t.token;
        triggers.append(std::move(d));
    }
    return py::dict("gbnf"_a = g.gbnf, "lazy"_a = g.lazy, "triggers"_a = std::move(triggers),
                    "preserved"_a = g.preserved, "prefill"_a = g.prefill);
}

py::dict render_dict(const lmsp::ChatRender & r) {
    py::dict d;
    d["prompt"] = py::str(r.prompt);
    d["format"] = r.format;
    d["format_name"] = r.format_name;
    d["grammar"] = grammar_dict(r.grammar);
    d["preserved"] = r.grammar.preserved;
    d["additional_stops"] = r.additional_stops;
    d["generation_prompt"] = py::str(r.generation_prompt);
    d["parser"] = py::str(r.parser);
    d["supports_thinking"] = r.supports_thinking;
    d["thinking_start"] = r.thinking_start;
    d["thinking_end"] = r.thinking_end;
    return d;
}

py::dict parsed_dict(const lmsp::ChatParsed & p) {
    py::list calls;
    for (const auto & c : p.tool_calls) {
        calls.append(
            py::dict("name"_a = py::str(c.name), "arguments"_a = py::str(c.arguments), "id"_a = py::str(c.id)));
    }
    return py::dict("content"_a = py::str(p.content), "reasoning"_a = py::str(p.reasoning),
                    "tool_calls"_a = std::move(calls));
}

}  // namespace

void bind_chat(py::module_ & m) {
    py::class_<lmsp::ChatTemplate>(m, "ChatTemplate", "A model's chat template (owned by its engine).")
        .def(
            "render",
            [](const lmsp::ChatTemplate & t, const std::string & messages, const std::string & tools,
               const std::string & tool_choice, bool parallel_tool_calls, const std::string & json_schema,
               const py::object & enable_thinking, const std::string & reasoning_effort, bool add_generation_prompt) {
                lmsp::ChatRequest r;
                r.messages_json = messages;
                r.tools_json = tools;
                r.tool_choice = tool_choice;
                r.parallel_tool_calls = parallel_tool_calls;
                r.json_schema = json_schema;
                r.enable_thinking = enable_thinking.is_none() ? -1 : int(py::bool_(enable_thinking));
                r.reasoning_effort = reasoning_effort;
                r.add_generation_prompt = add_generation_prompt;
                return render_dict(t.render(r));
            },
            "messages"_a, py::kw_only(), "tools"_a = "", "tool_choice"_a = "auto", "parallel_tool_calls"_a = false,
            "json_schema"_a = "", "enable_thinking"_a = py::none(), "reasoning_effort"_a = "",
            "add_generation_prompt"_a = true,
            "The chat layer's rendering of OpenAI-style messages and tools (JSON text): prompt, grammar, parser.")
        .def_property_readonly("caps", &lmsp::ChatTemplate::caps)
        .def_property_readonly("supports_thinking", &lmsp::ChatTemplate::supports_thinking);

    py::class_<lmsp::ChatParser>(m, "ChatParser", "The parser of one output of a rendered chat.")
        .def(py::init([](int format, const std::string & generation_prompt, const std::string & parser) {
                 return std::make_unique<lmsp::ChatParser>(format, generation_prompt, parser);
             }),
             "format"_a, "generation_prompt"_a, "parser"_a)
        .def(
            "parse",
            [](const lmsp::ChatParser & p, const std::string & text, bool partial) {
                return parsed_dict(p.parse(text, partial));
            },
            "text"_a, "partial"_a = false,
            "{content, reasoning, tool_calls: [{name, arguments, id}]} of an output (partial: the output so far).");
}
