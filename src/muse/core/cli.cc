#include "muse/core/cli.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace muse {

ArgParser::ArgParser(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

// An argument that names an option: "-x" or "--name", not a negative number.
static bool looks_like_option(const std::string& a) {
  return a.size() > 1 && a[0] == '-' && !(a[1] >= '0' && a[1] <= '9');
}

static Result<int64_t> to_int(const std::string& name, const std::string& v) {
  int64_t x = 0;
  auto r = std::from_chars(v.data(), v.data() + v.size(), x);
  if (r.ec != std::errc() || r.ptr != v.data() + v.size())
    return make_error(name + " expects an integer, got '" + v + "'");
  return x;
}

void ArgParser::flag(const std::string& name, bool* out, const std::string& help) {
  Spec s;
  s.name = name;
  s.help = help;
  s.takes_value = false;
  s.set = [name, out](const std::string& v) -> Status {
    if (v.empty() || v == "true" || v == "1") *out = true;
    else if (v == "false" || v == "0") *out = false;
    else return make_error(name + " takes no value (or =true/=false), got '" + v + "'");
    return Status::Ok();
  };
  specs_.push_back(std::move(s));
}

void ArgParser::option(const std::string& name, std::string* out, const std::string& metavar,
                       const std::string& help) {
  specs_.push_back({name, metavar, help, true, false, "", [out](const std::string& v) {
                      *out = v;
                      return Status::Ok();
                    }});
}

void ArgParser::option(const std::string& name, int64_t* out, const std::string& metavar, const std::string& help) {
  specs_.push_back({name, metavar, help, true, false, "", [name, out](const std::string& v) -> Status {
                      auto r = to_int(name, v);
                      if (!r.ok()) return r.error();
                      *out = *r;
                      return Status::Ok();
                    }});
}

void ArgParser::option(const std::string& name, int* out, const std::string& metavar, const std::string& help) {
  specs_.push_back({name, metavar, help, true, false, "", [name, out](const std::string& v) -> Status {
                      auto r = to_int(name, v);
                      if (!r.ok()) return r.error();
                      if (*r < INT32_MIN || *r > INT32_MAX) return make_error(name + " is out of range: " + v);
                      *out = int(*r);
                      return Status::Ok();
                    }});
}

void ArgParser::option(const std::string& name, double* out, const std::string& metavar, const std::string& help) {
  specs_.push_back({name, metavar, help, true, false, "", [name, out](const std::string& v) -> Status {
                      double x = 0;
                      auto r = std::from_chars(v.data(), v.data() + v.size(), x);
                      if (r.ec != std::errc() || r.ptr != v.data() + v.size() || !std::isfinite(x))
                        return make_error(name + " expects a number, got '" + v + "'");
                      *out = x;
                      return Status::Ok();
                    }});
}

void ArgParser::repeated(const std::string& name, std::vector<std::string>* out, const std::string& metavar,
                         const std::string& help) {
  specs_.push_back({name, metavar, help, true, false, "", [out](const std::string& v) {
                      out->push_back(v);
                      return Status::Ok();
                    }});
}

void ArgParser::alias(const std::string& alias, const std::string& name) { aliases_.emplace_back(alias, name); }

void ArgParser::positional(const std::string& name, std::string* out, bool required, const std::string& help) {
  positionals_.push_back({name, out, required, help});
}

void ArgParser::unsupported(const std::string& name, bool takes_value, const std::string& why,
                            std::vector<std::string> accepted_values) {
  Spec s;
  s.name = name;
  s.takes_value = takes_value;
  s.hidden = true;
  s.unsupported_why = why.empty() ? "not supported yet" : why;
  s.accepted_values = std::move(accepted_values);
  specs_.push_back(std::move(s));
}

void ArgParser::multi(const std::string& name, std::string* out, const std::string& metavar, const std::string& help) {
  option(name, out, metavar, help);
  specs_.back().multi = true;
}

ArgParser::Spec* ArgParser::find(const std::string& name) {
  std::string canonical = name;
  for (auto& a : aliases_) if (a.first == name) canonical = a.second;
  for (auto& s : specs_) if (s.name == canonical) return &s;
  // vLLM accepts both --max-model-len and --max_model_len.
  std::string dashed = canonical;
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  if (dashed != canonical) return find(dashed);
  return nullptr;
}

bool ArgParser::given(const std::string& name) const {
  return std::find(given_.begin(), given_.end(), name) != given_.end();
}

Status ArgParser::parse(int argc, char** argv, int first) {
  std::vector<std::string> args;
  for (int i = first; i < argc; ++i) args.emplace_back(argv[i]);
  return parse(args);
}

Status ArgParser::parse(const std::vector<std::string>& args) {
  size_t next_positional = 0;
  bool only_positional = false;
  std::vector<std::string> refused;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (!only_positional && (a == "--help" || a == "-h")) {
      help_ = true;
      return Status::Ok();
    }
    if (!only_positional && a == "--") {
      only_positional = true;
      continue;
    }
    if (!only_positional && looks_like_option(a)) {
      std::string name = a, value;
      bool has_value = false;
      size_t eq = a.find('=');
      if (eq != std::string::npos) {
        name = a.substr(0, eq);
        value = a.substr(eq + 1);
        has_value = true;
      }
      Spec* s = find(name);
      if (!s) return make_error("unknown option " + name + " for 'muse " + command_ + "' (see muse " + command_ + " --help)");
      if (s->takes_value && !has_value) {
        if (i + 1 >= args.size()) return make_error("option " + name + " needs a value");
        // A value that is itself an option ("--model --port 8001") is a
        // missing value, as argparse says, not a model called "--port".
        const std::string& next = args[i + 1];
        if (next.size() > 2 && next[0] == '-' && next[1] == '-')
          return make_error("option " + name + " needs a value (got the option " + next + ")");
        value = args[++i];
      }
      if (!s->unsupported_why.empty()) {
        // Refused, unless its value is the one muse behaves as anyway
        // (--pipeline-parallel-size 1); all refusals are reported together.
        if (s->accepted_values.empty() || std::find(s->accepted_values.begin(), s->accepted_values.end(),
                                                    has_value || s->takes_value ? value : "") == s->accepted_values.end())
          refused.push_back("option " + name + (s->takes_value ? " " + value : "") + ": " + s->unsupported_why);
        continue;
      }
      if (s->multi) {  // nargs='+': this value and every following one that is not an option
        while (i + 1 < args.size() && !looks_like_option(args[i + 1])) value += "," + args[++i];
      }
      MUSE_RETURN_IF_ERROR(s->set(value));
      given_.push_back(s->name);
      continue;
    }
    if (next_positional >= positionals_.size())
      return make_error("unexpected argument '" + a + "' for 'muse " + command_ + "'");
    *positionals_[next_positional++].out = a;
  }
  if (refused.size() == 1) return make_error(refused[0]);
  if (!refused.empty()) {
    std::string msg = std::to_string(refused.size()) + " options are not supported by muse " + command_ + ":";
    for (const auto& r : refused) msg += "\n  " + r;
    return make_error(msg);
  }
  for (size_t k = next_positional; k < positionals_.size(); ++k)
    if (positionals_[k].required) return make_error("missing argument " + positionals_[k].name);
  return Status::Ok();
}

std::string ArgParser::usage() const {
  std::string u = "usage: muse " + command_ + " [options]";
  for (const auto& p : positionals_) u += p.required ? " " + p.name : " [" + p.name + "]";
  u += "\n\n" + summary_ + "\n";
  if (!positionals_.empty()) {
    u += "\narguments:\n";
    for (const auto& p : positionals_) u += "  " + p.name + "\n      " + p.help + "\n";
  }
  u += "\noptions:\n";
  for (const auto& s : specs_) {
    if (s.hidden) continue;
    u += "  " + s.name;
    for (const auto& a : aliases_) if (a.second == s.name) u += ", " + a.first;
    if (s.takes_value) u += " " + (s.metavar.empty() ? std::string("VALUE") : s.metavar);
    u += "\n      " + s.help + "\n";
  }
  return u;
}

Result<std::vector<int64_t>> parse_int_list(const std::string& text) {
  std::vector<int64_t> out;
  size_t start = 0;
  if (text.empty()) return out;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(start, comma - start);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    auto v = to_int("list element", item);
    if (!v.ok()) return make_error("invalid integer '" + item + "' in list '" + text + "'");
    out.push_back(*v);
    start = comma + 1;
  }
  return out;
}

Result<int64_t> parse_token_count(const std::string& flag, const std::string& text) {
  if (text.empty()) return make_error(flag + " needs a value");
  double mult = 1;
  std::string num = text;
  switch (text.back()) {
    case 'k': mult = 1e3; break;
    case 'K': mult = 1024; break;
    case 'm': mult = 1e6; break;
    case 'M': mult = 1024.0 * 1024.0; break;
    case 'g': mult = 1e9; break;
    case 'G': mult = 1024.0 * 1024.0 * 1024.0; break;
    default: break;
  }
  if (mult != 1) num.pop_back();
  const bool plain = !num.empty() && num.find_first_not_of("0123456789.") == std::string::npos;
  char* end = nullptr;
  const double v = plain ? std::strtod(num.c_str(), &end) : 0.0;
  if (!plain || end != num.c_str() + num.size() || !std::isfinite(v) || v * mult < 1 || v * mult > 9e15 ||
      std::floor(v * mult) != v * mult)
    return make_error(flag + " expects a positive whole number of tokens such as 131072, 128K, 1.5k or 1M, got '" +
                      text + "'");
  return int64_t(v * mult);
}

Result<int64_t> parse_byte_size(const std::string& flag, const std::string& text) {
  const size_t number_end = text.find_first_not_of("0123456789.");
  const bool plain = !text.empty() && number_end != 0;
  const std::string num = text.substr(0, number_end), unit = number_end == std::string::npos ? "" : text.substr(number_end);
  char* end = nullptr;
  const double x = plain ? std::strtod(num.c_str(), &end) : 0.0;
  double mult = -1;
  if (unit == "" || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KiB" || unit == "k") mult = 1024.0;
  else if (unit == "M" || unit == "MiB" || unit == "m") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB" || unit == "g") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TiB" || unit == "t") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "TB") mult = 1e12;
  if (!plain || (end && *end) || mult < 0 || !(x * mult >= 1) || x * mult > 1e15)
    return make_error(flag + " expects a size like 4G, 512M or 1073741824, got '" + text + "'");
  return int64_t(x * mult);
}

}  // namespace muse
