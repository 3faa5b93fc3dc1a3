#include "fixtures.h"

#include "skip.h"

#include <array>
#include <chrono>
#include <fcntl.h>
#include <future>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <stdexcept>
#include <sys/wait.h>

namespace xpack::test {

namespace fs = std::filesystem;

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/xpack-test-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::vector<uint8_t> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + p.string());
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

void write_file(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + p.string());
}

static fs::path env_path(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return fs::path(v && *v ? v : fallback);
}

fs::path data_dir() { return env_path("XPACK_TEST_DATA", "test/data"); }
fs::path build_dir() { return env_path("XPACK_BUILD_ROOT", "build"); }

std::optional<fs::path> fixture_file(const fs::path& dir, const std::string& rel) {
  const fs::path p = dir / rel;
  if (fs::exists(p)) return p;
  skip(Absent::kFixture, p.string() + " is absent");
  return std::nullopt;
}

std::optional<fs::path> shared_dir() {
  fs::path p = env_path("XPACK_SHARED", "../shared");
  std::error_code ec;
  if (fs::is_directory(p / "oracle", ec)) return p;
  return std::nullopt;
}

int run_command(const std::string& cmd, std::string* output) {
  std::string full = cmd + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buf{};
  std::string out;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  int status = pclose(pipe);
  if (output) *output = std::move(out);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return -1;
}

std::filesystem::path make_fifo(const std::filesystem::path& path) {
  if (mkfifo(path.c_str(), 0600) != 0) throw std::runtime_error("mkfifo " + path.string() + " failed");
  return path;
}

bool returns_without_writer(const std::filesystem::path& fifo, const std::function<void()>& open_it,
                            int seconds) {
  auto done = std::async(std::launch::async, open_it);
  if (done.wait_for(std::chrono::seconds(seconds)) == std::future_status::ready) {
    done.get();
    return true;
  }
  // Blocked in open(): a writer end releases it (non-blocking open of the write
  // side succeeds because a reader is waiting), then closing it gives EOF.
  for (int i = 0; i < 100; ++i) {
    int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
      ::close(fd);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  done.get();
  return false;
}

}  // namespace xpack::test
