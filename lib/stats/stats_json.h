// Stats as JSON (the seed's keys where they exist, plus ours) and the atomic
// writer: a reader of the stats file sees either the old or the new document,
// never a torn one.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "stats/counters.h"

namespace xpack::stats {

// Counter fields, per-layer arrays, derived hit_rate / mean latencies and the
// histograms (bucket i = [2^i, 2^(i+1)) ns, trailing empty buckets dropped).
nlohmann::ordered_json counters_to_json(const Counters& c);

// Writes text to path via a temporary file in the same directory, fsync, rename,
// fsync of the directory.
Status write_file_atomic(const std::string& path, const std::string& text);

}  // namespace xpack::stats
