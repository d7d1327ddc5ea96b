// The `muse` executable is a set of subcommands, one file each
// (cmd_run.cc, cmd_serve.cc, ...). A file registers its command with
// MUSE_COMMAND; main.cc dispatches on argv[1].
#pragma once

namespace muse::tool {

// argv[0] is the subcommand name; flags follow.
using CommandFn = int (*)(int argc, char** argv);

struct CommandRegistrar {
  CommandRegistrar(const char* name, const char* summary, CommandFn fn, int order = 100);
};

}  // namespace muse::tool

#define MUSE_COMMAND(name, summary, fn, ...) \
  static ::muse::tool::CommandRegistrar muse_command_registrar_##fn(name, summary, fn __VA_OPT__(, ) __VA_ARGS__)
