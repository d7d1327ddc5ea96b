// muse: inference engine and OpenAI-compatible server for the Muse models.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "command.h"

namespace muse::tool {
namespace {

void print_usage(FILE* out) {
  std::vector<Command> commands = muse::tool::commands();
  std::sort(commands.begin(), commands.end(), [](const Command& a, const Command& b) {
    return a.order != b.order ? a.order < b.order : std::strcmp(a.name, b.name) < 0;
  });
  std::fprintf(out, "usage: muse <command> [options]\n\ncommands:\n");
  for (const auto& c : commands) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out, "\n'muse <command> --help' describes a command's options.\n");
}

int version_command(int, char**) {
  std::printf("muse %s\n", MUSE_VERSION);
  return 0;
}

}  // namespace

MUSE_COMMAND("version", "print the version", version_command, 1000);

}  // namespace muse::tool

int main(int argc, char** argv) {
  using namespace muse::tool;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) argv[1] = const_cast<char*>("version");
  for (const auto& c : commands()) {
    if (!std::strcmp(c.name, argv[1])) return c.fn(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "muse: unknown command '%s'\n\n", argv[1]);
  print_usage(stderr);
  return 2;
}
