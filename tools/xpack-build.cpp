// xpack-build: convert a GGUF MoE model into an Expert Pack + trunk GGUF + manifest.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_app.h"
#include "common/checked_math.h"
#include "pack/builder.h"
#include "progress_bar.h"

int main(int argc, char** argv) {
  using xpack::cli::App;
  xpack::pack::BuildOptions opts;
  bool json = false;
  App app("xpack-build", "xpack-build MODEL.gguf -o OUT [options]",
          "Writes OUT.xpack (the Expert Pack), OUT.xpack.json (manifest) and OUT.trunk.gguf\n"
          "(all metadata + every tensor that is not a routed expert). MODEL may be any\n"
          "shard NAME-0000k-of-0000N.gguf of a split set.",
          "exit status: 0 success, 1 failure, 2 usage error");
  app.positional("MODEL", &opts.source, "the GGUF model (one file, or any shard of a split set)")->required();
  app.text("-o,--output", "OUT", &opts.out, "output prefix (required)")->required();
  app.flag("--resume", &opts.resume, "continue an interrupted build (result is byte-identical)");
  app.flag("--verify", &opts.verify, "re-read the outputs and check them against the source");
  app.flag("--consume-source", &opts.consume_source,
           "delete each source shard once everything taken from it\n"
           "is durably written (needs about one shard of free space)");
  app.flag("--force", &opts.force,
           "overwrite existing outputs / restart an interrupted build;\n"
           "allow --consume-source on a single-file model");
  app.size("--buffer-mib", "SIZE", &opts.buffer_bytes, "copy buffer size in MiB, 1M..1T (default 256)", 1ull << 20,
           1ull << 20, 1ull << 40);
  bool progress = false;
  app.flag("--json", &json, "print one JSON summary on stdout (no progress bar unless --progress)");
  app.flag("--progress", &progress,
           "draw the progress bar (bytes/s, ETA) on stderr even when it is not a\n"
           "terminal, and with --json (default: only on a terminal, without --json)");
  // Test hooks (doc/pack-format.md), parsed like the rest but not in --help.
  App::hidden(app.count("--stop-after-objects", "N", &opts.stop_after_objects,
                        "behave like a crash after N objects", 0, UINT64_MAX));
  App::hidden(app.size("--assume-free-bytes", "SIZE", &opts.assume_free_bytes,
                       "pretend the output file system has this much free space", 1, 0, UINT64_MAX));
  App::hidden(app.size("--checkpoint-mib", "SIZE", &opts.checkpoint_bytes, "checkpoint at least this often", 1ull << 20,
                       0, 1ull << 40));
  if (auto rc = app.parse(argc, argv)) return *rc;
  if (const char* env = std::getenv("XPACK_BUILD_STOP_AFTER_OBJECTS"); env && !opts.stop_after_objects) {
    std::string why;  // a test hook: junk in it is ignored, as before
    xpack::cli::parse_count(env, 0, UINT64_MAX, &opts.stop_after_objects, &why);
  }

  ProgressBar bar(progress || (!json && isatty(STDERR_FILENO)));
  opts.progress = [&](const xpack::pack::BuildProgress& p) { bar.update(p.phase, p.done, p.total); };
  auto r = xpack::pack::build_pack(opts);
  bar.finish();
  if (!r.ok()) {
    app.failure(r.error().message);
    if (json) {
      nlohmann::ordered_json j;
      j["ok"] = false;
      j["code"] = r.error().code;
      j["error"] = r.error().message;
      std::printf("%s\n", j.dump().c_str());
    }
    return 1;
  }
  const auto& rep = *r;
  const auto& idx = rep.index;
  double mib_s = rep.copy_seconds > 0 ? double(rep.copied_bytes) / rep.copy_seconds / (1 << 20) : 0;
  if (json) {
    nlohmann::ordered_json j;
    j["ok"] = true;
    j["pack"] = rep.pack_path;
    j["manifest"] = rep.manifest_path;
    j["trunk"] = rep.trunk_path;
    j["arch"] = idx.arch;
    j["n_layers"] = idx.n_layers();
    j["n_experts"] = idx.n_experts;
    j["n_objects"] = idx.n_objects();
    j["object_stride"] = idx.object_stride;
    j["pack_bytes"] = idx.file_size;
    j["trunk_bytes"] = rep.trunk_bytes;
    j["source_bytes"] = rep.source_bytes;
    j["copied_bytes"] = rep.copied_bytes;
    j["copy_seconds"] = rep.copy_seconds;
    j["throughput_mib_s"] = mib_s;
    j["verify_seconds"] = rep.verify_seconds;
    j["seconds"] = rep.seconds;
    j["resumed_from_object"] = rep.resumed_from_object;
    j["verified"] = rep.verified;
    j["verified_against_source"] = rep.verified_against_source;
    j["consumed"] = rep.consumed;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  char a[32], b[32];
  std::printf("pack     %s (%s, %u layers x %u experts, stride %llu)\n", rep.pack_path.c_str(),
              xpack::human_bytes(idx.file_size, a, sizeof a), idx.n_layers(), idx.n_experts,
              static_cast<unsigned long long>(idx.object_stride));
  std::printf("trunk    %s (%s)\n", rep.trunk_path.c_str(), xpack::human_bytes(rep.trunk_bytes, b, sizeof b));
  std::printf("manifest %s\n", rep.manifest_path.c_str());
  if (rep.resumed_from_object) std::printf("resumed from object %llu\n", static_cast<unsigned long long>(rep.resumed_from_object));
  std::printf("copied %s in %.2f s (%.1f MiB/s)\n", xpack::human_bytes(rep.copied_bytes, a, sizeof a),
              rep.copy_seconds, mib_s);
  if (opts.verify)
    std::printf("verified in %.2f s%s\n", rep.verify_seconds,
                rep.verified_against_source ? " (against the source)" : " (pack checksums; some source files were consumed)");
  for (const auto& c : rep.consumed) std::printf("deleted source %s\n", c.c_str());
  return 0;
}
