// The trunk GGUF: all metadata and every tensor that is not a routed expert, with
// identical bytes, plus the keys that tie it to its pack (pack/identity.h).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/result.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "pack/format.h"

namespace xpack::pack {

// The layout of the trunk: shard 0's metadata minus the split.* keys (the trunk is
// one file), plus xpack.source_identity and xpack.pack_format_version; the tensors
// in source order with the source's alignment.
Result<gguf::Writer> trunk_layout(const gguf::File& meta, const std::vector<gguf::TensorInfo>& tensors,
                                  const Index& idx);

// Writes the trunk to `path` (created/truncated), copying each tensor from its shard
// through `buf` (bounded memory), then records each tensor's checksum (read back
// from `path`) in xpack.tensor_xxh3 and fsyncs. `on_bytes(n)` reports progress.
Status write_trunk(const std::string& path, gguf::Writer& w, const std::vector<gguf::TensorInfo>& tensors,
                   const std::vector<const gguf::File*>& shards, std::vector<uint8_t>& buf,
                   const std::function<void(uint64_t)>& on_bytes);

// Checks every tensor of a trunk against its xpack.tensor_xxh3 entry (nothing to
// check for a GGUF without xpack.source_identity, i.e. an original source file):
// XPACK_E_CHECKSUM names the first damaged tensor (*bad_tensor, if given, gets its
// name); XPACK_E_UNSUPPORTED if the trunk has no checksums (an older xpack-build).
Status verify_trunk(const std::string& path, std::string* bad_tensor = nullptr);

}  // namespace xpack::pack
