// A file descriptor that polls readable once written to, for callers that
// wait on the engine's results from an event loop (Engine::fileno).
#pragma once

namespace lmsp {

// An eventfd on Linux, a pipe elsewhere (rfd then differs from wfd); both
// ends non-blocking and closed on exec.
void open_notifier(int & rfd, int & wfd);
void close_notifier(int & rfd, int & wfd);
// Makes rfd readable (a full pipe already is).
void signal_notifier(int wfd);
// Reads rfd until it is no longer readable.
void clear_notifier(int rfd);

}  // namespace lmsp
