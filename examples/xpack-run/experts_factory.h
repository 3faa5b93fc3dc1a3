// Constructors of the two ExpertSource implementations.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend.h"
#include "experts.h"
#include "weights.h"

namespace xrun {

struct PackSourceOptions {
  std::string pack_path;
  std::string trunk_path;      // checked against the pack's identity ("" = no check)
  uint64_t budget_bytes = 0;   // expert cache budget
  bool verify = true;          // xxh3 of every object read
  bool allow_buffered_io = false;  // O_DIRECT refused: page cache, with a warning (else an error)
  std::string trace_path;      // routing trace CSV written by the cache ("" = none)
  int threads = 0;             // parallel reads of the direct reader (0 = all cores)
  bool cuda = false;           // cache slots in VRAM (XPACK_DEVICE_CUDA), for the CUDA backend
};

// Experts served from an Expert Pack through libxpack's C API, kept in a
// byte-budgeted cache; experts that do not fit are read again when next used.
std::unique_ptr<ExpertSource> make_pack_experts(const PackSourceOptions& opts, int n_expected_experts);

// The same through libxpack's expert cache (xpack_cache_*, host device).
// Nullptr, with the reason in *why_not, when the cache cannot be created for
// this budget/pack (e.g. fewer slots than top-k); pack errors throw.
std::unique_ptr<ExpertSource> make_cache_experts(const PackSourceOptions& opts, int n_expected_experts,
                                                 std::string* why_not);

// Experts sliced out of the 3-D ffn_*_exps tensors of a plain GGUF. Nullptr
// when the GGUF has no routed-expert tensors at all.
std::unique_ptr<ExpertSource> make_gguf_experts(const Weights& w);

// A host-memory source (the plain GGUF's) seen from a device backend: each
// (layer, expert) is uploaded with be.upload on first use and kept for the
// source's life (experts_upload.cpp).
std::unique_ptr<ExpertSource> make_uploaded_experts(std::unique_ptr<ExpertSource> host, Backend& be);

}  // namespace xrun
