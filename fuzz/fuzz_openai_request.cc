// Request validation for /v1/chat/completions, /v1/completions,
// /v1/messages and /v1/responses, then the response writers and the fake model's streaming
// parser on text taken from the input. Bad input must become an ApiError with
// a 4xx status and a parameter name, never a crash.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "muse/server/api_request.h"
#include "muse/server/response_writer.h"
#include "muse/server/stop_matcher.h"

#include "../tests/support/fake_model/fake_model.h"

using namespace muse;
using namespace muse::server;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view all(reinterpret_cast<const char*>(data), size);
  uint8_t selector = data[0];
  std::string_view bytes = all.substr(1);

  Json body;
  if (auto e = parse_json_body(bytes, &body)) {
    if (e->status != 400) std::abort();
  } else {
    ValidationLimits limits;
    limits.vocab_size = 512;
    ApiRequest req;
    std::optional<ApiError> err = selector % 4 == 0 ? parse_chat_request(body, limits, &req)
                                  : selector % 4 == 1 ? parse_completion_request(body, limits, &req)
                                  : selector % 4 == 2 ? parse_messages_request(body, limits, &req)
                                                      : parse_responses_request(body, limits, &req);
    if (err) {
      if (err->status < 400 || err->status >= 500 || err->message.empty()) std::abort();
      (void)openai_error_body(*err);
      (void)anthropic_error_body(*err);
    } else {
      if (req.generation.n < 1 || req.generation.logprobs > limits.max_logprobs) std::abort();
      for (const auto& s : req.generation.stop_strings)
        if (s.empty()) std::abort();
    }
  }

  // Streaming parser + writers on text from the input, split at a point the
  // selector chooses.
  FakeModelOptions fo;
  static ServeBackend backend = make_fake_backend(fo);
  ParserOptions po;
  po.tools_enabled = selector & 1;
  auto parser = backend.adapter->make_output_parser(po);
  size_t split = bytes.empty() ? 0 : selector % (bytes.size() + 1);
  ParsedDelta a, b;
  parser->feed({}, bytes.substr(0, split), a);
  parser->feed({}, bytes.substr(split), b);
  parser->finish(FinishReason::Stop, b);
  WriterOptions wo;
  wo.id = "x";
  for (auto make : {make_chat_writer, make_messages_writer, make_completion_writer, make_responses_writer}) {
    auto w = make(wo);
    for (const ParsedDelta* d : {&a, &b}) {
      ChoiceDelta cd;
      cd.reasoning = sanitize_utf8(d->reasoning);
      cd.content = sanitize_utf8(d->content);
      cd.text = cd.content;
      for (const auto& t : d->tool_calls) cd.tool_calls.push_back({t.index, t.name.empty() ? "" : "id", sanitize_utf8(t.name), sanitize_utf8(t.arguments)});
      (void)w->stream_delta(0, cd, {});
      w->add(0, cd);
    }
    (void)w->stream_finish(0, {"stop", Json()});
    (void)w->stream_end({});
    (void)w->body({});
  }
  StopStringMatcher m({std::string(bytes.substr(0, split % 7)), "\n\n"}, selector & 2);
  (void)m.push(bytes.substr(split));
  (void)m.flush();
  return 0;
}
