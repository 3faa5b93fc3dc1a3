// Helpers for the xpack-run end-to-end tests: locate the built tools and the
// test models, run a command with stdout and stderr kept apart.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace xrun_test {

namespace fs = std::filesystem;

struct RunResult {
  int rc = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `cmd` through the shell.
RunResult run(const std::string& cmd);

fs::path xpack_run_exe();
fs::path xpack_build_exe();
fs::path xpack_synth_exe();
fs::path source_root();

// stories260K.gguf from test/data (or ../shared/models), sha256-checked;
// nullopt when absent.
std::optional<fs::path> stories260k();

// ../shared/oracle when it holds models/<model_file>; nullopt otherwise.
std::optional<fs::path> oracle_dir_with(const std::string& model_file);

// A JSON file, parsed; throws (with the path) when it cannot be read.
nlohmann::json read_json(const fs::path& p);

// Hex SHA-256 of a file.
std::string sha256_file(const fs::path& p);

// Raw little-endian float32 file.
std::vector<float> read_f32(const fs::path& p);

// "1,2,3"
std::string join_ids(const std::vector<int32_t>& ids);

// Shell-quoted path.
std::string q(const fs::path& p);

}  // namespace xrun_test
