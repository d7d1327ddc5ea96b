// The `muse` executable is a set of subcommands, one file each
// (cmd_run.cc, cmd_serve.cc, ...). A file registers its command with
// MUSE_COMMAND; main.cc dispatches on argv[1] (the registry is in command.cc).
#pragma once

#include <string>
#include <vector>

#include "muse/core/cli.h"

namespace muse::tool {

// argv[0] is the subcommand name; flags follow.
using CommandFn = int (*)(int argc, char** argv);

struct CommandRegistrar {
  CommandRegistrar(const char* name, const char* summary, CommandFn fn, int order = 100);
};

struct Command {
  const char* name;
  const char* summary;
  CommandFn fn;
  int order;
};
// Every registered command, in registration order.
const std::vector<Command>& commands();

// Parses a command's flags: on a bad flag prints "muse COMMAND: message" on
// stderr and returns 2; after --help prints the usage and returns 0;
// otherwise returns -1 (go on).
int parse_flags(ArgParser& args, int argc, char** argv, const char* command);

// Prints "muse COMMAND: message" on stderr and returns 2 (the exit code for
// bad input everywhere in the tool).
int fail(const char* command, const std::string& message);

}  // namespace muse::tool

#define MUSE_COMMAND(name, summary, fn, ...) \
  static ::muse::tool::CommandRegistrar muse_command_registrar_##fn(name, summary, fn __VA_OPT__(, ) __VA_ARGS__)
