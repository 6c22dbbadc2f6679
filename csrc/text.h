// Streaming-safe text: token pieces arrive as bytes; only whole, valid UTF-8
// characters are released, and text that may be the start of a stop string is
// held back until it is decided.
#pragma once

#include <string>
#include <vector>

namespace lmsp {

// Moves the longest prefix of `raw` that is decided as UTF-8 into `out`:
// valid characters as they are, each invalid byte as U+FFFD, and NUL as
// U+FFFD too (text the service wrote must be taken back as input in a later
// turn, and no prompt takes a NUL). An incomplete
// character at the end stays in `raw` unless `final` is true (then it becomes
// U+FFFD too).
void utf8_take(std::string & raw, std::string & out, bool final);

// True when `s` is well-formed UTF-8 throughout.
bool utf8_valid(const std::string & s);

class TextStream {
public:
    explicit TextStream(std::vector<std::string> stops);

    // Adds the bytes of one token; returns the text that is now safe to show.
    // After a stop string is found, stopped() is true and nothing more is
    // released (the stop string itself never is).
    std::string push(const std::string & bytes);

    // End of the sequence (max tokens, end of generation, cancel): releases
    // what was held back; an incomplete character becomes U+FFFD.
    std::string flush();

    // For a resumed sequence whose tokens were replayed through push():
    // `already` is the text the first run emitted. Makes emitted() equal to
    // it, so that later releases continue right after it. False when
    // `already` is not a prefix of the replayed text.
    bool adopt_emitted(const std::string & already);

    bool stopped() const { return stopped_; }
    const std::string & emitted() const { return emitted_; }
    // Held back, not yet released (valid UTF-8 part only).
    const std::string & held() const { return held_; }

private:
    std::string release(std::string text);

    std::vector<std::string> stops_;
    std::string raw_;   // bytes of an incomplete character
    std::string held_;  // valid text not yet released
    std::string emitted_;
    bool stopped_ = false;
};

}  // namespace lmsp
