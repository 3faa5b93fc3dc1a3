// xpack-inspect: summary of an Expert Pack; --verify checks every object checksum.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_app.h"
#include "common/checked_math.h"
#include "gguf/ggml_type.h"
#include "pack/describe.h"
#include "pack/pack_reader.h"
#include "progress_bar.h"

namespace {

std::string role_name(const xpack::pack::PackReader& r, const xpack::pack::Fault& f) {
  if (f.padding) return "(padding after the payload)";
  return f.role >= 0 ? r.roles()[f.role].name : std::string("(between roles)");
}

}  // namespace

int main(int argc, char** argv) {
  std::string path, trunk;
  bool json = false, verify = false, progress = false;
  xpack::cli::App app(
      "xpack-inspect", "xpack-inspect PACK [--json] [--verify [--progress]] [--trunk GGUF]",
      "Prints the model architecture, layers, experts, roles (type, offset, bytes),\n"
      "object stride, payload vs padding bytes and the source identity of an Expert Pack.",
      "exit status: 0 all well, 1 damaged/unreadable pack, 2 usage error");
  app.positional("PACK", &path, "the Expert Pack (PREFIX.xpack)")->required();
  app.flag("--json", &json,
           "one JSON object on stdout (keys: format, version, arch, data_start,\n"
           "object_stride, n_experts, layers, roles[{name,type,offset,nbytes}], ...)");
  app.flag("--verify", &verify,
           "check the xxh3-64 of every object and role, the zero padding, and\n"
           "every trunk tensor; names the first bad (layer, expert, role) or tensor");
  app.flag("--progress", &progress,
           "with --verify: draw progress (bytes/s, ETA) on stderr even when it is not\n"
           "a terminal, and with --json (default: only on a terminal, without --json)");
  app.text("--trunk", "GGUF", &trunk,
           "the pack's trunk (or its source): its identity is checked (default:\n"
           "PREFIX.trunk.gguf beside PREFIX.xpack, when it exists)");
  if (auto rc = app.parse(argc, argv)) return *rc;
  // xpack-build writes PREFIX.trunk.gguf beside PREFIX.xpack: check it by default, so
  // --verify covers the trunk's tensors too.
  if (trunk.empty() && path.size() > 6 && path.ends_with(".xpack")) {
    const std::string beside = path.substr(0, path.size() - 6) + ".trunk.gguf";
    std::error_code ec;
    if (std::filesystem::is_regular_file(beside, ec)) trunk = beside;
  }
  auto opened = xpack::pack::PackReader::open(path, xpack::pack::OpenOptions{trunk});
  if (!opened.ok()) {
    app.failure(opened.error().message);
    if (json) {
      nlohmann::ordered_json j;
      j["ok"] = false;
      j["code"] = opened.error().code;
      j["error"] = opened.error().message;
      std::printf("%s\n", j.dump(2).c_str());
    }
    return 1;
  }
  const auto& r = *opened;
  const auto& idx = r.index();

  xpack::Status vs;
  xpack::pack::Fault fault;
  if (verify) {
    // On stderr: --json's stdout stays one JSON document.
    ProgressBar bar(progress || (!json && isatty(STDERR_FILENO)));
    struct Ctx {
      ProgressBar* bar;
      uint64_t stride;
    } ctx{&bar, idx.object_stride};
    auto cb = [](uint64_t done, uint64_t total, void* c) {
      auto* x = static_cast<Ctx*>(c);
      x->bar->update("verify", done * x->stride, total * x->stride);
    };
    bar.update("verify", 0, idx.n_objects() * idx.object_stride);  // the clock starts before the first read
    vs = r.validate(xpack::pack::ValidateLevel::kChecksums, &fault, +cb, &ctx);
    bar.finish();
  }

  if (json) {
    auto j = xpack::pack::describe_index(idx);
    j["path"] = path;
    if (!trunk.empty()) j["trunk_identity_ok"] = true;
    if (verify) {
      nlohmann::ordered_json v;
      v["ok"] = vs.ok();
      if (!vs.ok()) {
        v["error"] = vs.error().message;
        if (vs.error().code == XPACK_E_OBJECT_CHECKSUM) {
          v["layer"] = fault.block;
          v["layer_slot"] = fault.layer_slot;
          v["expert"] = fault.expert;
          v["role"] = role_name(r, fault);
        }
      }
      j["verify"] = v;
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    char a[32], b[32], c[32];
    uint64_t payload = xpack::pack::payload_bytes(idx);
    std::printf("Expert Pack v%u  %s\n", idx.version, path.c_str());
    std::printf("arch           %s\n", idx.arch.c_str());
    std::string layers;
    for (uint32_t blk : idx.layer_blocks) layers += (layers.empty() ? "" : ",") + std::to_string(blk);
    std::printf("layers         %u MoE layers: blocks %s\n", idx.n_layers(), layers.c_str());
    std::printf("experts        %u per layer, top-k %u, %llu objects\n", idx.n_experts, idx.n_experts_used,
                static_cast<unsigned long long>(idx.n_objects()));
    std::printf("object         %llu payload bytes, stride %llu, data_start %llu\n",
                static_cast<unsigned long long>(idx.object_bytes), static_cast<unsigned long long>(idx.object_stride),
                static_cast<unsigned long long>(idx.data_start));
    std::printf("roles          %-8s %-6s %12s %12s  %s\n", "name", "type", "offset", "bytes", "shape");
    for (const auto& role : idx.roles) {
      const auto* ti = xpack::gguf::type_info(role.type);
      std::string shape;
      for (uint32_t d = 0; d < role.n_dims; ++d) shape += (d ? " x " : "") + std::to_string(role.ne[d]);
      std::printf("               %-8s %-6s %12llu %12llu  %s  (%s)\n", role.name.c_str(), ti ? ti->name : "?",
                  static_cast<unsigned long long>(role.offset), static_cast<unsigned long long>(role.nbytes),
                  shape.c_str(), role.source_pattern.c_str());
    }
    std::printf("file           %s: payload %s, padding + index %s\n", xpack::human_bytes(idx.file_size, a, sizeof a),
                xpack::human_bytes(payload, b, sizeof b), xpack::human_bytes(idx.file_size - payload, c, sizeof c));
    std::printf("source         %s (%zu file%s)\n", r.source_identity_hex().c_str(), idx.shards.size(),
                idx.shards.size() == 1 ? "" : "s");
    if (!trunk.empty()) std::printf("trunk          %s belongs to this pack\n", trunk.c_str());
    if (verify) {
      if (vs.ok())
        std::printf("verify         OK: all %llu objects match their checksums\n",
                    static_cast<unsigned long long>(idx.n_objects()));
      else if (vs.error().code == XPACK_E_OBJECT_CHECKSUM)
        std::printf("verify         FAILED: layer %u (slot %u), expert %u, role %s is damaged\n", fault.block,
                    fault.layer_slot, fault.expert, role_name(r, fault).c_str());
      else
        std::printf("verify         FAILED: %s\n", vs.error().message.c_str());
    }
  }
  if (!vs.ok()) return app.failure(vs.error().message);
  return 0;
}
