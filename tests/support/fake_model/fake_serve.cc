// muse_fake: `muse serve` over the deterministic fake model (fake_model.h), for
// the tests that need a server over HTTP without weights (the client-library
// tests, the load test, the vLLM-flag test). Same flags and serving loop as
// `muse serve` (tools/muse/cmd_serve.cc is linked in), plus the fake's own:
//
//   muse_fake serve [muse serve flags] [--step-ms MS] [--load-ms MS]
//
// MODEL is optional and ignored; the served name defaults to "muse-fake".
#include <cstdio>
#include <cstring>

#include "../../../tools/muse/serve_command.h"
#include "fake_model.h"

int main(int argc, char** argv) {
  using namespace muse;
  if (argc < 2 || std::strcmp(argv[1], "serve") != 0) {
    std::fprintf(stderr, "usage: muse_fake serve [muse serve flags] [--step-ms MS] [--load-ms MS]\n");
    return 2;
  }
  server::FakeModelOptions fake;
  tool::ServeBackendOverride o;
  o.model_name = "muse-fake";
  o.add_flags = [&](ArgParser& args) {
    args.option("--step-ms", &fake.step_ms, "MS", "fake engine step time (default 2)");
    args.option("--load-ms", &fake.load_ms, "MS", "fake loading time (default 0)");
  };
  o.make_backend = [&](const server::ServeOptions& so) -> Result<server::ServeBackend> {
    fake.max_model_len = so.engine.max_model_len > 0 ? so.engine.max_model_len : 4096;
    fake.max_num_seqs = so.engine.max_num_seqs;
    fake.max_num_batched_tokens = so.engine.max_num_batched_tokens;
    fake.default_seed = so.engine.seed;
    return server::make_fake_backend(fake);
  };
  return tool::serve_main(argc - 1, argv + 1, &o);
}
