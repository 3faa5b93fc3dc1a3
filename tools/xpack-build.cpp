// xpack-build: convert a GGUF MoE model into an Expert Pack + trunk GGUF + manifest.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "common/checked_math.h"
#include "pack/builder.h"
#include "xpack-build-progress.h"

namespace {

const char kUsage[] =
    "usage: xpack-build MODEL.gguf -o OUT [options]\n"
    "\n"
    "Writes OUT.xpack (the Expert Pack), OUT.xpack.json (manifest) and OUT.trunk.gguf\n"
    "(all metadata + every tensor that is not a routed expert). MODEL may be any\n"
    "shard NAME-0000k-of-0000N.gguf of a split set.\n"
    "\n"
    "options:\n"
    "  -o, --output OUT     output prefix (required)\n"
    "  --resume             continue an interrupted build (result is byte-identical)\n"
    "  --verify             re-read the outputs and check them against the source\n"
    "  --consume-source     delete each source shard once everything taken from it\n"
    "                       is durably written (needs about one shard of free space)\n"
    "  --force              overwrite existing outputs / restart an interrupted build;\n"
    "                       allow --consume-source on a single-file model\n"
    "  --buffer-mib N       copy buffer size (default 256)\n"
    "  --json               print one JSON summary on stdout (no progress bar)\n"
    "  -h, --help           this help\n"
    "\n"
    "exit status: 0 success, 1 failure, 2 usage error\n";

int usage_error(const char* msg) {
  std::fprintf(stderr, "xpack-build: %s\n\n%s", msg, kUsage);
  return 2;
}

bool parse_u64(const char* s, uint64_t* out) {
  if (!s || !*s) return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (errno || *end || s[0] == '-') return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  xpack::pack::BuildOptions opts;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "-o" || a == "--output") {
      const char* v = next();
      if (!v) return usage_error("-o needs a value");
      opts.out = v;
    } else if (a == "--resume") {
      opts.resume = true;
    } else if (a == "--verify") {
      opts.verify = true;
    } else if (a == "--consume-source") {
      opts.consume_source = true;
    } else if (a == "--force") {
      opts.force = true;
    } else if (a == "--json") {
      json = true;
    } else if (a == "--buffer-mib") {
      uint64_t mib;
      if (!parse_u64(next(), &mib) || mib == 0 || mib > (1u << 20)) return usage_error("--buffer-mib needs 1..1048576");
      opts.buffer_bytes = mib << 20;
    } else if (a == "--stop-after-objects") {  // test hook, not in --help
      if (!parse_u64(next(), &opts.stop_after_objects)) return usage_error("--stop-after-objects needs a number");
    } else if (a == "--assume-free-bytes") {  // test hook, not in --help
      if (!parse_u64(next(), &opts.assume_free_bytes)) return usage_error("--assume-free-bytes needs a number");
    } else if (a == "--checkpoint-mib") {      // test hook, not in --help
      uint64_t mib;
      if (!parse_u64(next(), &mib)) return usage_error("--checkpoint-mib needs a number");
      opts.checkpoint_bytes = mib << 20;
    } else if (!a.empty() && a[0] == '-') {
      return usage_error(("unknown option " + a).c_str());
    } else if (opts.source.empty()) {
      opts.source = a;
    } else {
      return usage_error("more than one MODEL given");
    }
  }
  if (opts.source.empty()) return usage_error("no MODEL given");
  if (opts.out.empty()) return usage_error("no output prefix given (-o OUT)");
  if (const char* env = std::getenv("XPACK_BUILD_STOP_AFTER_OBJECTS"); env && !opts.stop_after_objects)
    parse_u64(env, &opts.stop_after_objects);

  ProgressBar bar(!json && isatty(STDERR_FILENO));
  opts.progress = [&](const xpack::pack::BuildProgress& p) { bar.update(p.phase, p.done, p.total); };
  auto r = xpack::pack::build_pack(opts);
  bar.finish();
  if (!r.ok()) {
    std::fprintf(stderr, "xpack-build: %s\n", r.error().message.c_str());
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
