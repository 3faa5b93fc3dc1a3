// The xpack-run drivers the CUDA model tests compare CUDA and CPU runs with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpu_available.h"

namespace xpack::test::gpu {

// max |a[i] - b[i]|; both the same size and a finite (REQUIREd).
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);

// An oracle run's ids (logits/<ref>.json): the prompt and the tokens llama.cpp generated.
struct OracleRun {
  std::vector<int32_t> prompt, gen;
  std::vector<int32_t> all() const;
};
OracleRun load_run(const std::filesystem::path& oracle, const std::string& ref);

// xpack-run ARGS --json --logits-out OUT (exit 0 REQUIREd): the JSON, the logits in *logits.
nlohmann::json run_logits(const std::string& args, const std::filesystem::path& out, std::vector<float>* logits);

// Teacher-forced: every id as one batch, no generation (n_vocab logits per id).
std::vector<float> batch_logits(const std::string& model_args, const std::vector<int32_t>& ids,
                                const std::filesystem::path& out, size_t n_vocab);

// Greedy decode of n_gen tokens after the prompt, one token per eval; the ids generated.
std::vector<int32_t> decode(const std::string& model_args, const std::vector<int32_t>& prompt, size_t n_gen,
                            const std::filesystem::path& out, std::vector<float>* logits, size_t n_vocab);

}  // namespace xpack::test::gpu
