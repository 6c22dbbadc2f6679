#include "huge_pages.h"

#include <cerrno>
#include <cstdint>
#include <fstream>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#endif

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

size_t back_with_huge_pages(void * base, size_t size, size_t page) {
#if defined(__linux__)
    if (page == 0 || base == nullptr) return 0;
    const uintptr_t begin = (uintptr_t(base) + page - 1) / page * page;
    const uintptr_t end = (uintptr_t(base) + size) / page * page;
    if (end <= begin) return 0;
    // from then on: what cannot be collapsed now, khugepaged collapses later
    if (madvise(reinterpret_cast<void *>(begin), end - begin, MADV_HUGEPAGE) != 0) return 0;
    size_t bytes = 0;
    // one page at a time: one that finds no free huge page does not stop the others
    for (uintptr_t p = begin; p < end; p += page) {
        if (madvise(reinterpret_cast<void *>(p), page, MADV_COLLAPSE) == 0) {
            bytes += page;
        } else if (errno == EINVAL) {
            break;  // a kernel before 6.1: khugepaged's work alone
        }
    }
    return bytes;
#else
    (void)base;
    (void)size;
    (void)page;
    return 0;
#endif
}

}  // namespace lmsp
