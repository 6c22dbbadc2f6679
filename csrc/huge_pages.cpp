#include "huge_pages.h"

#include <time.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "low_priority.h"

namespace lmsp {

namespace {

// <sys/mman.h> of glibc before 2.37 does not name it
#if defined(__linux__) && !defined(MADV_COLLAPSE)
constexpr int MADV_COLLAPSE = 25;
#endif

constexpr const char * kThpDir = "/sys/kernel/mm/transparent_hugepage/";

std::string first_line(const std::string & path) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    return line;
}

std::chrono::nanoseconds thread_cpu() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

}  // namespace

size_t huge_page_size() {
#if defined(__linux__)
    // "always [madvise] never": the bracketed word is the setting
    const std::string enabled = first_line(std::string(kThpDir) + "enabled");
    if (enabled.empty() || enabled.find("[never]") != std::string::npos) return 0;
    const std::string size = first_line(std::string(kThpDir) + "hpage_pmd_size");
    try {
        return size.empty() ? 0 : size_t(std::stoull(size));
    } catch (const std::exception &) {
        return 0;
    }
#else
    return 0;
#endif
}

HugePageCollapse::HugePageCollapse(const std::vector<std::pair<void *, size_t>> & ranges, size_t page) : page_(page) {
#if defined(__linux__)
    for (const auto & [base, size] : ranges) {
        if (page == 0 || base == nullptr) break;
        const uintptr_t begin = (uintptr_t(base) + page - 1) / page * page;
        const uintptr_t end = (uintptr_t(base) + size) / page * page;
        if (end <= begin) continue;
        // from then on: what is not collapsed here, khugepaged collapses later
        if (madvise(reinterpret_cast<void *>(begin), end - begin, MADV_HUGEPAGE) != 0) continue;
        for (uintptr_t p = begin; p < end; p += page) pages_.push_back(reinterpret_cast<char *>(p));
    }
#else
    (void)ranges;
#endif
    if (pages_.empty()) {
        done_ = true;
        return;
    }
    thread_ = std::thread([this] { run(); });
}

void HugePageCollapse::stop() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

// One page at a time (one that finds no free huge page does not stop the
// others), resting kPaceRest times the CPU time of each between them.
void HugePageCollapse::run() {
#if defined(__linux__)
    setpriority(PRIO_PROCESS, id_t(syscall(SYS_gettid)), kLowPriorityNice);
    for (char * p : pages_) {
        const auto cpu = thread_cpu();
        if (madvise(p, page_, MADV_COLLAPSE) == 0) {
            bytes_ += page_;
        } else if (errno == EINVAL) {
            break;  // a kernel before 6.1: khugepaged's work alone
        }
        std::unique_lock<std::mutex> lk(mu_);
        if (cv_.wait_for(lk, (thread_cpu() - cpu) * kPaceRest, [this] { return stop_; })) break;
    }
#endif
    done_ = true;
}

}  // namespace lmsp
