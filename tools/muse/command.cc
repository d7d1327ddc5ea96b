// The command registry and the flag helpers every subcommand uses; main.cc
// dispatches. Apart from main.cc so that a test executable can link one
// command file (tests/support/fake_model/fake_serve.cc links cmd_serve.cc).
#include <cstdio>

#include "command.h"

namespace muse::tool {

namespace {
std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace

CommandRegistrar::CommandRegistrar(const char* name, const char* summary, CommandFn fn, int order) {
  registry().push_back({name, summary, fn, order});
}

const std::vector<Command>& commands() { return registry(); }

int parse_flags(ArgParser& args, int argc, char** argv, const char* command) {
  Status st = args.parse(argc, argv);
  if (!st.ok()) return fail(command, st.message());
  if (args.help_requested()) return std::printf("%s", args.usage().c_str()), 0;
  return -1;
}

int fail(const char* command, const std::string& message) {
  std::fprintf(stderr, "muse %s: %s\n", command, message.c_str());
  return 2;
}

}  // namespace muse::tool
