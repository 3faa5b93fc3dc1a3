#include "io/huge_pages.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace xpack::io {
namespace {

std::string read_text(const char* path) {
  std::ifstream f(path);
  if (!f) return {};
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// "Name:   1234 kB" -> bytes.
uint64_t kb_field(const std::string& line) {
  auto colon = line.find(':');
  if (colon == std::string::npos) return 0;
  return std::strtoull(line.c_str() + colon + 1, nullptr, 10) * 1024;
}

}  // namespace

ThpMode thp_mode() {
  std::string t = read_text("/sys/kernel/mm/transparent_hugepage/enabled");
  if (t.find("[always]") != std::string::npos) return ThpMode::kAlways;
  if (t.find("[madvise]") != std::string::npos) return ThpMode::kMadvise;
  if (t.find("[never]") != std::string::npos) return ThpMode::kNever;
  return ThpMode::kAbsent;
}

const char* thp_mode_name(ThpMode m) {
  switch (m) {
    case ThpMode::kAlways: return "always";
    case ThpMode::kMadvise: return "madvise";
    case ThpMode::kNever: return "never";
    case ThpMode::kAbsent: break;
  }
  return "absent";
}

uint64_t thp_page_bytes() {
  std::string t = read_text("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
  if (!t.empty()) return std::strtoull(t.c_str(), nullptr, 10);
  return 0;
}

uint64_t hugetlb_free_pages(uint64_t page_bytes) {
  std::string path = "/sys/kernel/mm/hugepages/hugepages-" + std::to_string(page_bytes / 1024) +
                     "kB/free_hugepages";
  std::string t = read_text(path.c_str());
  return t.empty() ? 0 : std::strtoull(t.c_str(), nullptr, 10);
}

PageBacking measure_backing(const void* base) {
  PageBacking b;
  std::ifstream f("/proc/self/smaps");
  if (!f) return b;
  const auto want = reinterpret_cast<uintptr_t>(base);
  std::string line;
  bool in_vma = false;
  uint64_t hugetlb = 0;
  while (std::getline(f, line)) {
    // A VMA header starts with "start-end " in hex; field lines with "Name:".
    uintptr_t start = 0, end = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " ", &start, &end) == 2 &&
        line.find('-') < line.find(' ')) {
      if (in_vma) break;  // the next VMA: ours is complete
      in_vma = start == want;
      if (in_vma) {
        b.known = true;
        b.mapping_bytes = end - start;
      }
      continue;
    }
    if (!in_vma) continue;
    if (line.rfind("KernelPageSize:", 0) == 0) b.kernel_page_bytes = kb_field(line);
    else if (line.rfind("AnonHugePages:", 0) == 0) b.huge_bytes = kb_field(line);
    else if (line.rfind("Private_Hugetlb:", 0) == 0 || line.rfind("Shared_Hugetlb:", 0) == 0)
      hugetlb += kb_field(line);
  }
  if (hugetlb) b.huge_bytes = hugetlb;
  return b;
}

}  // namespace xpack::io
