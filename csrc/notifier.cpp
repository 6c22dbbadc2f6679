#include "notifier.h"

#include <fcntl.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/eventfd.h>
#endif

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "errors.h"

namespace lmsp {

void open_notifier(int & rfd, int & wfd) {
#ifdef __linux__
    rfd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (rfd < 0) throw NativeFailure(std::string("eventfd: ") + std::strerror(errno));
    wfd = rfd;
#else
    int fds[2];
    if (::pipe(fds) != 0) throw NativeFailure(std::string("pipe: ") + std::strerror(errno));
    for (int fd : fds) {
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
        ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    rfd = fds[0];
    wfd = fds[1];
#endif
}

void close_notifier(int & rfd, int & wfd) {
    if (wfd >= 0 && wfd != rfd) ::close(wfd);
    if (rfd >= 0) ::close(rfd);
    rfd = wfd = -1;
}

void signal_notifier(int wfd) {
    const uint64_t one = 1;
    ssize_t rc = ::write(wfd, &one, sizeof(one));
    (void)rc;  // a full pipe is already readable
}

void clear_notifier(int rfd) {
    uint64_t value;
    while (::read(rfd, &value, sizeof(value)) > 0) {}
}

}  // namespace lmsp
