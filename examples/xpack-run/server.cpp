#include "server.h"

#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <thread>

#include <httplib.h>

#include "chat_cli.h"
#include "chat_template.h"
#include "server_engine.h"
#include "server_gate.h"
#include "server_metrics.h"
#include "server_routes.h"

namespace xrun {

namespace {

// A model that does not state its context still needs a bound: every request's
// prompt and max_tokens are checked against it.
constexpr int64_t kContextWhenUnstated = 4096;

// Threads beyond the generation queue's: /health, /metrics and the connections
// a client keeps alive between requests are never stuck behind a generation.
constexpr size_t kSpareThreads = 8;

ChatFormat chat_format(const Weights& w, const CliOptions& o) {
  if (o.chat_format != "auto") return chat_format_from_name(o.chat_format).value_or(ChatFormat::kPlain);
  const std::string tmpl = w.has("tokenizer.chat_template") ? w.get_string("tokenizer.chat_template") : "";
  const ChatFormat f = detect_chat_format(tmpl);
  if (!tmpl.empty() && f == ChatFormat::kPlain)
    std::fprintf(stderr, "xpack-run: --server: tokenizer.chat_template is not a format xpack-run renders "
                         "(deepseek-v4, kimi-k3, chatml); chat uses the plain fallback\n");
  return f;
}

size_t max_piece_bytes(const Weights& w) {
  size_t n = 1;
  if (w.has("tokenizer.ggml.tokens"))
    for (const std::string& t : w.get_string_array("tokenizer.ggml.tokens")) n = std::max(n, t.size());
  return n;
}

}  // namespace

std::string server_unavailable() { return {}; }

int run_server(const ServerRun& r) {
  const CliOptions& o = r.options;
  // A client gone mid-answer must fail the write, not kill the process.
  std::signal(SIGPIPE, SIG_IGN);
  const int64_t n_ctx = r.n_ctx > 0 ? r.n_ctx : kContextWhenUnstated;
  if (r.n_ctx <= 0)
    std::fprintf(stderr, "xpack-run: --server: the model states no context length; requests are held to %lld tokens\n",
                 static_cast<long long>(n_ctx));
  const ChatFormat format = chat_format(r.weights, o);
  Engine engine({r.model, r.codec, r.experts, n_ctx, r.eos, format, chat_bos_text(r.weights, r.codec),
                 max_piece_bytes(r.weights), o.n_predict});
  RequestGate gate(static_cast<size_t>(o.server_queue));
  ServerMetrics metrics;
  metrics.set_engine_counters(engine.engine_counters());
  const std::string model_id =
      !o.server_alias.empty() ? o.server_alias : std::filesystem::path(o.model_path).filename().string();
  ServerState state{engine, gate, metrics, model_id, static_cast<int64_t>(std::time(nullptr)), o.sampling};

  httplib::Server svr;
  const size_t n_threads = static_cast<size_t>(o.server_queue) + 1 + kSpareThreads;
  svr.new_task_queue = [n_threads] { return new httplib::ThreadPool(n_threads); };
  add_routes(svr, state);
  int port = o.port;
  if (port == 0) {
    port = svr.bind_to_any_port(o.host);
    if (port < 0) port = 0;
  } else if (!svr.bind_to_port(o.host, port)) {
    port = 0;
  }
  if (port == 0) {
    std::fprintf(stderr, "xpack-run: --server: cannot listen on %s:%d: %s\n", o.host.c_str(), o.port,
                 std::strerror(errno));
    return 1;
  }
  // Scripts (and the tests, with --port 0) read the address from this line.
  std::fprintf(stderr, "xpack-run: server listening on http://%s:%d (model %s, chat format %s, context %lld, queue %d)\n",
               o.host.c_str(), port, model_id.c_str(), chat_format_name(format), static_cast<long long>(n_ctx),
               o.server_queue);
  std::fflush(stderr);
  const bool ok = svr.listen_after_bind();
  gate.close();
  return ok ? 0 : 1;
}

}  // namespace xrun
