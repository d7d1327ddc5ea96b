// Command-line parsing for `muse` subcommands. Each subcommand declares its
// flags into a typed options struct; unknown flags are errors, and flags we
// know from `vllm serve` but do not implement yet are refused by name.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "muse/core/status.h"

namespace muse {

class ArgParser {
 public:
  ArgParser(std::string command, std::string summary);

  // --name (no value). `--name=true|false` is also accepted.
  void flag(const std::string& name, bool* out, const std::string& help);
  void option(const std::string& name, std::string* out, const std::string& metavar, const std::string& help);
  void option(const std::string& name, int64_t* out, const std::string& metavar, const std::string& help);
  void option(const std::string& name, int* out, const std::string& metavar, const std::string& help);
  void option(const std::string& name, double* out, const std::string& metavar, const std::string& help);
  // A flag that may repeat; each value is appended.
  void repeated(const std::string& name, std::vector<std::string>* out, const std::string& metavar,
                const std::string& help);
  // Alternative spelling for an already declared flag (e.g. "-m" for "--model").
  void alias(const std::string& alias, const std::string& name);
  void positional(const std::string& name, std::string* out, bool required, const std::string& help);
  // A flag that exists elsewhere (vllm serve) but is not implemented here yet:
  // using it is an error that names it and says why, unless its value is one
  // of `accepted_values` (what muse does anyway, e.g. a pipeline size of 1).
  // Every refused flag of a command line is reported, in one error.
  void unsupported(const std::string& name, bool takes_value, const std::string& why,
                   std::vector<std::string> accepted_values = {});
  // An option taking one or more values (argparse nargs='+'): the values
  // after it up to the next option, joined with commas into *out.
  void multi(const std::string& name, std::string* out, const std::string& metavar, const std::string& help);

  // Parses argv[first..argc). `--help`/`-h` sets help_requested() and succeeds.
  Status parse(int argc, char** argv, int first = 1);
  Status parse(const std::vector<std::string>& args);
  bool help_requested() const { return help_; }
  // Whether a flag (by canonical name) appeared on the command line.
  bool given(const std::string& name) const;
  std::string usage() const;

 private:
  struct Spec {
    std::string name;
    std::string metavar;
    std::string help;
    bool takes_value = true;
    bool hidden = false;
    std::string unsupported_why;  // non-empty: refuse
    std::function<Status(const std::string&)> set;
    std::vector<std::string> accepted_values;  // refused flags: values accepted (and ignored)
    bool multi = false;                        // nargs='+'
  };
  Spec* find(const std::string& name);

  std::string command_, summary_;
  std::vector<Spec> specs_;
  std::vector<std::pair<std::string, std::string>> aliases_;
  struct Positional {
    std::string name;
    std::string* out;
    bool required;
    std::string help;
  };
  std::vector<Positional> positionals_;
  std::vector<std::string> given_;
  bool help_ = false;
};

// Parses "1,2,3" into integers; error names the bad element.
Result<std::vector<int64_t>> parse_int_list(const std::string& text);

// vLLM's human-readable token counts (--max-model-len): 131072, 128k (x1000),
// 128K (x1024), 1m, 1M, 25.6k; a whole positive number, no hex or exponent.
Result<int64_t> parse_token_count(const std::string& flag, const std::string& text);
// Byte sizes (--kv-cache-memory-bytes): 4G / 4GiB = 4 * 2^30, 4GB = 4 * 10^9,
// 512M, or plain bytes; at least one byte.
Result<int64_t> parse_byte_size(const std::string& flag, const std::string& text);

}  // namespace muse
