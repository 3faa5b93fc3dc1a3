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

// The oracle's rule (../shared/oracle/MANIFEST.md): the first sequence position
// where one of llama.cpp's routed-expert choices (its route.json) had a margin
// below 2e-5, or n_rows if none; from there a tiny numeric difference may pick
// another, equally valid expert.
size_t first_fragile_position(const nlohmann::json& route, size_t n_rows);

// Rows [0, n_rows) of two logits arrays of n_vocab floats per row: the largest
// |difference|, how many rows are within tol, the first row that is not (-1: none).
// Throws std::runtime_error when either array is shorter than n_rows rows.
struct RowStats {
  double max_diff = 0;
  size_t rows_ok = 0;
  long first_fail = -1;
};
RowStats compare_rows(const std::vector<float>& got, const std::vector<float>& want, size_t n_rows, int n_vocab,
                      double tol);

// deepseek4_variant.py's random-weight deepseek4 models, which move the sizes and
// layer patterns the oracle models fix: test_deepseek4.cpp checks them against
// the float64 reference, test_deepseek4_cuda.cpp checks CUDA against the CPU.
struct Deepseek4Variant {
  const char* what;
  const char* hp;  // JSON overrides of deepseek4_variant.py's defaults
  int seed;
};
const std::vector<Deepseek4Variant>& deepseek4_variants();

// Runs deepseek4_variant.py to write `v` as `model`, the tokenizer taken from
// `vocab` (stories260K.gguf).
RunResult write_deepseek4_variant(const Deepseek4Variant& v, const fs::path& vocab, const fs::path& model);

// "1,2,3"
std::string join_ids(const std::vector<int32_t>& ids);

// Shell-quoted path.
std::string q(const fs::path& p);

}  // namespace xrun_test
