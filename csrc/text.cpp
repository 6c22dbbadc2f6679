#include "text.h"

#include <algorithm>

namespace lmsp {
namespace {

enum class Utf8 { complete, incomplete, invalid };

// Classifies the character starting at s[0] (n bytes available). On
// `complete`, len is its length; on `invalid`, len is the length of the
// maximal ill-formed subpart, replaced by ONE U+FFFD (as Python's and the
// WHATWG decoders do).
Utf8 classify(const unsigned char * s, size_t n, size_t & len) {
    const unsigned char c = s[0];
    unsigned char lo = 0x80, hi = 0xBF;
    size_t need = 0;
    if (c < 0x80) {
        len = 1;
        return Utf8::complete;
    } else if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;  // no overlong forms
        if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;  // no overlong forms
        if (c == 0xF4) hi = 0x8F;  // not above U+10FFFF
    } else {
        len = 1;
        return Utf8::invalid;
    }
    for (size_t i = 1; i < need; ++i) {
        if (i >= n) {
            return Utf8::incomplete;
        }
        const unsigned char b = s[i];
        const unsigned char l = (i == 1) ? lo : 0x80;
        const unsigned char h = (i == 1) ? hi : 0xBF;
        if (b < l || b > h) {
            len = i;
            return Utf8::invalid;
        }
    }
    len = need;
    return Utf8::complete;
}

const char kReplacement[] = "\xEF\xBF\xBD";

}  // namespace

void utf8_take(std::string & raw, std::string & out, bool final) {
    const auto * s = reinterpret_cast<const unsigned char *>(raw.data());
    const size_t n = raw.size();
    size_t i = 0;
    while (i < n) {
        size_t len = 0;
        const Utf8 k = classify(s + i, n - i, len);
        if (k == Utf8::complete && s[i] == 0) {
            out += kReplacement;  // NUL: no chat template or tokenizer takes it back
            i += len;
        } else if (k == Utf8::complete) {
            out.append(raw, i, len);
            i += len;
        } else if (k == Utf8::invalid) {
            out += kReplacement;
            i += len;
        } else {  // incomplete at the end
            if (final) {
                out += kReplacement;
                i = n;
            }
            break;
        }
    }
    raw.erase(0, i);
}

bool utf8_valid(const std::string & s) {
    const auto * p = reinterpret_cast<const unsigned char *>(s.data());
    size_t i = 0;
    while (i < s.size()) {
        size_t len = 0;
        if (classify(p + i, s.size() - i, len) != Utf8::complete) return false;
        i += len;
    }
    return true;
}

TextStream::TextStream(std::vector<std::string> stops) : stops_(std::move(stops)) {
    stops_.erase(std::remove_if(stops_.begin(), stops_.end(), [](const std::string & s) { return s.empty(); }),
                 stops_.end());
}

std::string TextStream::release(std::string text) {
    emitted_ += text;
    return text;
}

std::string TextStream::push(const std::string & bytes) {
    if (stopped_) {
        return {};
    }
    raw_ += bytes;
    utf8_take(raw_, held_, false);

    // The stop string that completes first ends the sequence (the one whose
    // end comes first in the text; on a tie the longer one), so the result
    // does not depend on how the text was cut into tokens.
    size_t first = std::string::npos, first_end = std::string::npos;
    for (const auto & stop : stops_) {
        const size_t at = held_.find(stop);
        if (at == std::string::npos) continue;
        const size_t end = at + stop.size();
        if (end < first_end || (end == first_end && at < first)) {
            first = at;
            first_end = end;
        }
    }
    if (first != std::string::npos) {
        std::string out = held_.substr(0, first);
        held_.clear();
        raw_.clear();
        stopped_ = true;
        return release(std::move(out));
    }

    // hold back the longest tail that is a proper prefix of some stop string
    size_t hold = 0;
    for (const auto & stop : stops_) {
        const size_t max_k = std::min(stop.size() - 1, held_.size());
        for (size_t k = max_k; k > hold; --k) {
            if (held_.compare(held_.size() - k, k, stop, 0, k) == 0) {
                hold = k;
                break;
            }
        }
    }
    std::string out = held_.substr(0, held_.size() - hold);
    held_.erase(0, held_.size() - hold);
    return release(std::move(out));
}

std::string TextStream::flush() {
    if (stopped_) {
        return {};
    }
    std::string out;
    out.swap(held_);
    utf8_take(raw_, out, true);
    return release(std::move(out));
}

bool TextStream::adopt_emitted(const std::string & already) {
    const std::string produced = emitted_ + held_;
    if (already.size() <= produced.size()) {
        if (produced.compare(0, already.size(), already) != 0) {
            return false;
        }
        held_ = produced.substr(already.size());
        emitted_ = already;
        return true;
    }
    // The first run may have flushed held text that the replay still holds:
    // that can only be the held part plus a replaced incomplete character.
    std::string flushed = produced;
    std::string raw = raw_;
    utf8_take(raw, flushed, true);
    if (already == flushed) {
        held_.clear();
        raw_.clear();
        emitted_ = already;
        return true;
    }
    return false;
}

}  // namespace lmsp
