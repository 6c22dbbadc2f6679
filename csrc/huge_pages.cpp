#include "huge_pages.h"

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
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
// others), paced as a KV file's work is (low_priority.h).
void HugePageCollapse::run() {
#if defined(__linux__)
    lower_this_thread();
    bool old_kernel = false;
    paced_pieces(
        pages_.size(),
        [&](size_t i) {
            if (old_kernel) return;
            if (madvise(pages_[i], page_, MADV_COLLAPSE) == 0) {
                bytes_ += page_;
            } else if (errno == EINVAL) {
                old_kernel = true;  // a kernel before 6.1: khugepaged's work alone
            }
        },
        [&](std::chrono::steady_clock::duration d) {
            std::unique_lock<std::mutex> lk(mu_);
            return !cv_.wait_for(lk, d, [this] { return stop_; }) && !old_kernel;
        });
#endif
    done_ = true;
}

}  // namespace lmsp
