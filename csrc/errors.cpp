#include "errors.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "llama.h"

namespace lmsp::log {
namespace {

std::atomic<bool> g_enabled{false};
std::once_flag g_installed;

thread_local bool t_capturing = false;
thread_local std::string t_captured;
thread_local ggml_log_level t_last_level = GGML_LOG_LEVEL_NONE;

void sink(ggml_log_level level, const char * text, void * /*user_data*/) {
    if (text == nullptr) {
        return;
    }
    if (level == GGML_LOG_LEVEL_CONT) {
        level = t_last_level;
    } else {
        t_last_level = level;
    }
    if (t_capturing && (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN)) {
        if (t_captured.size() < 4096) {
            t_captured += text;
        }
    }
    if (g_enabled.load(std::memory_order_relaxed)) {
        std::fputs(text, stderr);
    }
}

}  // namespace

void install() {
    std::call_once(g_installed, [] {
        const char * env = std::getenv("LMSP_LLAMA_LOG");
        if (env != nullptr && *env != '\0' && std::strcmp(env, "0") != 0) {
            g_enabled = true;
        }
        llama_log_set(sink, nullptr);
    });
}

void set_enabled(bool enabled) {
    install();
    g_enabled = enabled;
}

bool enabled() { return g_enabled.load(); }

void begin_capture() {
    t_capturing = true;
    t_captured.clear();
}

std::string end_capture() {
    t_capturing = false;
    std::string out;
    out.swap(t_captured);
    // one line, without the trailing newline
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) {
        out.pop_back();
    }
    for (char & c : out) {
        if (c == '\n') {
            c = ';';
        }
    }
    return out;
}

}  // namespace lmsp::log
