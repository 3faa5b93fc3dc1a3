// xpack-build's engine: GGUF (single file or split set) -> OUT.xpack + OUT.xpack.json
// + OUT.trunk.gguf, streaming with bounded memory, resumable, optionally deleting
// source shards as soon as everything taken from them is durable.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/result.h"
#include "pack/format.h"

namespace xpack::pack {

struct BuildProgress {
  const char* phase = "";   // "trunk", "experts", "verify"
  uint64_t done = 0;        // bytes
  uint64_t total = 0;
};

struct BuildOptions {
  std::string source;       // any file of the model (any shard of a split set)
  std::string out;          // output prefix: OUT.xpack, OUT.xpack.json, OUT.trunk.gguf
  bool resume = false;      // continue an interrupted build (no checkpoint: start fresh)
  bool verify = false;      // re-read the outputs and check them against the source
  bool consume_source = false;
  bool force = false;       // overwrite outputs; allow consuming a single-file source
  uint64_t buffer_bytes = 256ull << 20;     // copy buffer (memory bound)
  uint64_t checkpoint_bytes = 1ull << 30;   // durable checkpoint at least this often
  // Test hook: behave like a crash once this many objects are written (the last
  // batch is written but not checkpointed). 0 = off.
  uint64_t stop_after_objects = 0;
  // Test hook: pretend the output file system has this many free bytes. 0 = off.
  uint64_t assume_free_bytes = 0;
  std::function<void(const BuildProgress&)> progress;  // may be empty
};

struct BuildReport {
  std::string pack_path, manifest_path, trunk_path;
  Index index;                     // the final index
  uint64_t trunk_bytes = 0;        // size of the trunk file
  uint64_t trunk_tensors = 0;
  uint64_t source_bytes = 0;       // total size of the source files
  uint64_t copied_bytes = 0;       // bytes read from the source by this run
  uint64_t resumed_from_object = 0;
  double seconds = 0;              // whole run
  double copy_seconds = 0;         // trunk + experts
  double verify_seconds = 0;
  bool verified = false;
  bool verified_against_source = false;
  std::vector<std::string> consumed;  // source files deleted
};

// Error code XPACK_E_INTERNAL with message "stopped after N objects (test hook)" when
// stop_after_objects fires.
Result<BuildReport> build_pack(const BuildOptions& opts);

// The output file names for a prefix.
struct OutputPaths {
  std::string pack, partial, checkpoint, manifest, trunk, trunk_partial;
};
OutputPaths output_paths(const std::string& out);

}  // namespace xpack::pack
