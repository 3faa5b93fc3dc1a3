// Helpers shared by the doctest suites: scratch directories, file I/O, and the
// locations of the test data folders.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace xpack::test {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

std::vector<uint8_t> read_file(const std::filesystem::path& p);
void write_file(const std::filesystem::path& p, const std::vector<uint8_t>& bytes);

// test/data in the source tree.
std::filesystem::path data_dir();
// The build directory (tools are built there: build/tools/xpack-build ...).
std::filesystem::path build_dir();
// ../shared next to the checkout, if present. Tests that need it must report
// themselves as skipped (doctest MESSAGE + return) when this is empty.
std::optional<std::filesystem::path> shared_dir();
// dir / rel when that file exists; otherwise records a skip (Absent::kFixture)
// naming it and returns nothing: a fixture folder that lacks one file (a partial
// copy of ../shared) skips the cases that need the file instead of failing them.
std::optional<std::filesystem::path> fixture_file(const std::filesystem::path& dir, const std::string& rel);

// Runs a shell command, returns its exit status and captures stdout+stderr.
int run_command(const std::string& cmd, std::string* output = nullptr);

// Creates a FIFO at `path` (mkfifo) for the "refuse before blocking" tests.
std::filesystem::path make_fifo(const std::filesystem::path& path);
// Runs `open_it` (which opens `fifo` for reading) on a thread. If it has not
// returned within `seconds`, opens the FIFO for writing, which releases a reader
// blocked in open(), so a regression fails the test instead of hanging it.
// Returns true when open_it returned on its own.
bool returns_without_writer(const std::filesystem::path& fifo, const std::function<void()>& open_it,
                            int seconds = 5);

}  // namespace xpack::test
