#include "server_routes.h"

#include <chrono>
#include <ctime>
#include <exception>
#include <memory>
#include <variant>

#include <httplib.h>

#include "server_openai.h"

namespace xrun {

namespace {

using Clock = std::chrono::steady_clock;

// A non-streamed answer writes one space (JSON allows leading whitespace) this
// often while it generates: a write to a client that has gone fails, which is
// how its generation learns to stop. "; charset=utf-8" keeps cpp-httplib from
// gzipping the answer, which would hold the probes back in the compressor.
constexpr auto kProbeEvery = std::chrono::milliseconds(50);
constexpr const char* kJsonChunked = "application/json; charset=utf-8";

// The status counted for an answer its client closed before the end (the
// headers had gone out with 200): nginx's 499.
constexpr int kClientClosed = 499;

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump_json(error_json(e)), "application/json");
}

// One generation from its prefill to its last byte. It holds the gate's turn:
// the next request starts once this is destroyed, after the response is done.
struct Job {
  RequestGate::Turn turn;  // first member: released last, after the counters are copied
  ServerState& state;
  std::unique_ptr<Generation> gen;
  ResponseHead head;
  std::string endpoint;
  bool include_usage = false;
  bool recorded = false;

  // Counted before the last bytes go out, so that a client which has its whole
  // answer finds it in /metrics; a response cut short is counted as it ends.
  void record(int status) {
    if (recorded) return;
    recorded = true;
    state.metrics.count_generation(gen->stats(), status == kClientClosed);
    state.metrics.count_response(endpoint, status);
    // The sources count in plain integers: copied while this request still holds the model.
    state.metrics.set_engine_counters(state.engine.engine_counters());
  }

  ~Job() { record(kClientClosed); }

  Usage usage() const { return {gen->stats().prompt_tokens, gen->stats().completion_tokens}; }

  bool write(httplib::DataSink& sink, const std::string& s) { return sink.write(s.data(), s.size()); }

  // Streams chunks as the text becomes whole characters; a failed write is a
  // client gone: false ends the response and with it the generation.
  bool stream(httplib::DataSink& sink) {
    std::string pending;
    if (head.chat && !write(sink, sse_event(chunk_json(head, "", "", true)))) return false;
    bool more = true;
    while (more) {
      try {
        more = gen->step(&pending);
      } catch (const std::exception& e) {
        record(500);
        write(sink, sse_event(error_json({500, std::string("generation failed: ") + e.what(), "server_error", "", ""})));
        sink.done();
        return true;
      }
      const size_t whole = more ? utf8_complete_prefix(pending) : pending.size();
      if (whole == 0 && more) continue;
      if (!write(sink, sse_event(chunk_json(head, pending.substr(0, whole), more ? "" : gen->finish_reason(), false))))
        return false;
      pending.erase(0, whole);
    }
    if (include_usage && !write(sink, sse_event(usage_chunk_json(head, usage())))) return false;
    record(200);
    write(sink, std::string(kSseDone));
    sink.done();
    return true;
  }

  bool whole(httplib::DataSink& sink) {
    std::string text;
    auto last_probe = Clock::now();
    try {
      while (gen->step(&text)) {
        if (Clock::now() - last_probe < kProbeEvery) continue;
        if (!write(sink, " ")) return false;
        last_probe = Clock::now();
      }
    } catch (const std::exception& e) {
      // The status went out with the headers: cutting the chunked body short
      // is what tells the client the answer failed.
      record(500);
      std::fprintf(stderr, "xpack-run: server: generation failed: %s\n", e.what());
      return false;
    }
    record(200);
    write(sink, dump_json(completion_json(head, text, gen->finish_reason(), usage())));
    sink.done();
    return true;
  }
};

void generate(ServerState& st, const httplib::Request& req, httplib::Response& res, bool chat) {
  const std::string endpoint = chat ? "chat_completions" : "completions";
  auto refuse = [&](const ApiError& e) {
    st.metrics.count_response(endpoint, e.status);
    send_error(res, e);
  };
  auto parsed = parse_generate_request(req.body, chat, st.defaults);
  if (const ApiError* e = std::get_if<ApiError>(&parsed)) return refuse(*e);
  const GenerateRequest& r = std::get<GenerateRequest>(parsed);
  auto prepared = st.engine.prepare(r);
  if (const ApiError* e = std::get_if<ApiError>(&prepared)) return refuse(*e);
  std::optional<RequestGate::Turn> turn = st.gate.try_enter();
  if (!turn)
    return refuse({503, "the server is busy: the queue of requests waiting for the model is full; retry later",
                   "server_error", "", "queue_full"});
  if (!turn->wait()) return refuse({503, "the server is stopping", "server_error", "", ""});
  std::unique_ptr<Generation> gen;
  try {
    gen = st.engine.start(std::move(std::get<PreparedRequest>(prepared)));
  } catch (const std::exception& e) {
    return refuse({500, std::string("evaluating the prompt failed: ") + e.what(), "server_error", "", ""});
  }
  std::shared_ptr<Job> job(new Job{std::move(*turn), st, std::move(gen), {}, endpoint, r.include_usage});
  job->head.id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(++st.next_id);
  job->head.created = static_cast<int64_t>(std::time(nullptr));
  job->head.model = r.model.empty() ? st.model_id : r.model;
  job->head.chat = chat;
  if (r.stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream",
                                     [job](size_t, httplib::DataSink& sink) { return job->stream(sink); });
  } else {
    res.set_chunked_content_provider(kJsonChunked, [job](size_t, httplib::DataSink& sink) { return job->whole(sink); });
  }
}

}  // namespace

void add_routes(httplib::Server& svr, ServerState& st) {
  svr.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  svr.Get("/v1/models", [&st](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump_json(models_json(st.model_id, st.created)), "application/json");
  });
  svr.Get("/metrics", [&st](const httplib::Request&, httplib::Response& res) {
    res.set_content(st.metrics.render(st.gate.counts()), "text/plain; version=0.0.4");
  });
  svr.Post("/v1/completions",
           [&st](const httplib::Request& req, httplib::Response& res) { generate(st, req, res, false); });
  svr.Post("/v1/chat/completions",
           [&st](const httplib::Request& req, httplib::Response& res) { generate(st, req, res, true); });
  // Everything else cpp-httplib refuses (404, 413, 400 for a bad request line)
  // gets an OpenAI error object too; the routes' own errors already have one.
  svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const std::string what = res.status == 404   ? "no route " + req.method + " " + req.path
                             : res.status == 413 ? "the request body is larger than " +
                                                       std::to_string(kMaxBodyBytes) + " bytes"
                                                 : "the request was refused";
    send_error(res, {res.status, what, res.status >= 500 ? "server_error" : "invalid_request_error", "", ""});
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what += std::string(": ") + e.what();
    } catch (...) {
    }
    send_error(res, {500, what, "server_error", "", ""});
  });
  svr.set_payload_max_length(kMaxBodyBytes);
}

}  // namespace xrun
