// Global functions of every render: jinja2's defaults (range with the
// sandbox's MAX_RANGE, dict, namespace, joiner, cycler) and the two that
// transformers adds (raise_exception, strftime_now).
#include <ctime>
#include <functional>

#include "muse/jinja/builtins.h"
#include "muse/jinja/filters_internal.h"
#include "muse/jinja/interpreter.h"

namespace muse::jinja {

using namespace filters;

namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

struct BuiltinFunction : Callable {
  using Fn = std::function<Value(Interpreter&, CallArgs&)>;
  BuiltinFunction(std::string n, Fn f) : name(std::move(n)), fn(std::move(f)) {}
  Value call(Interpreter& in, CallArgs& args) override { return fn(in, args); }
  std::string repr() const override { return "<function " + name + ">"; }
  std::string name;
  Fn fn;
};

Value make_fn(std::string name, BuiltinFunction::Fn fn) {
  return Value(std::shared_ptr<Callable>(std::make_shared<BuiltinFunction>(std::move(name), std::move(fn))));
}

// dict(*args, **kwargs) / namespace(*args, **kwargs) initialisation.
DictData dict_from_args(Interpreter& in, CallArgs& a, const char* fn) {
  DictData d;
  if (a.args.size() > 1) type_error(std::string(fn) + " expected at most 1 argument, got " + std::to_string(a.args.size()));
  if (a.args.size() == 1) {
    const Value& src = a.args[0];
    if (src.is_dict()) {
      d = src.as_dict();
    } else {
      size_t i = 0;
      for (const auto& pair : in.iterate(src)) {
        std::vector<Value> kv = in.iterate(pair);
        if (kv.size() != 2)
          type_error("dictionary update sequence element #" + std::to_string(i) + " has length " +
                     std::to_string(kv.size()) + "; 2 is required");
        d.set(kv[0], kv[1]);
        ++i;
      }
    }
  }
  for (auto& [k, v] : a.kwargs) d.set(Value(k), v);
  return d;
}

Value range_fn(Interpreter& in, CallArgs& a) {
  if (!a.kwargs.empty()) type_error("range() takes no keyword arguments");
  if (a.args.empty() || a.args.size() > 3)
    type_error("range expected at most 3 arguments, got " + std::to_string(a.args.size()));
  int64_t start = 0, stop, step = 1;
  std::vector<int64_t> n;
  for (const auto& v : a.args) {
    if (!v.is_int() && !v.is_bool()) {
      fail_if_undefined(v);
      type_error("'" + type_name(v) + "' object cannot be interpreted as an integer");
    }
    n.push_back(v.as_int());
  }
  if (n.size() == 1) {
    stop = n[0];
  } else {
    start = n[0];
    stop = n[1];
    if (n.size() == 3) step = n[2];
  }
  if (step == 0) type_error("range() arg 3 must not be zero");
  // Count without overflow, then apply the sandbox's limit.
  __int128 count = 0;
  if (step > 0 && stop > start) count = ((__int128)stop - start + step - 1) / step;
  if (step < 0 && stop < start) count = ((__int128)start - stop - step - 1) / -step;
  if (count > kMaxRange)
    type_error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  std::vector<Value> out;
  out.reserve(size_t(count));
  for (__int128 i = 0; i < count; ++i) out.emplace_back(int64_t(start + i * step));
  in.step(out.size());
  return in.make_list(std::move(out));
}

struct Joiner : Callable {
  explicit Joiner(std::string s) : sep(std::move(s)) {}
  Value call(Interpreter&, CallArgs& args) override {
    if (!args.args.empty() || !args.kwargs.empty()) type_error("joiner() takes no arguments");
    if (!used) {
      used = true;
      return Value("");
    }
    return Value(sep);
  }
  std::string repr() const override { return "<jinja2.utils.Joiner object>"; }
  std::string_view type_name() const override { return "Joiner"; }
  std::string sep;
  bool used = false;
};

struct Cycler : Callable, std::enable_shared_from_this<Cycler> {
  explicit Cycler(std::vector<Value> v) : items(std::move(v)) {}
  Value call(Interpreter&, CallArgs&) override { type_error("'Cycler' object is not callable"); }
  std::string repr() const override { return "<jinja2.utils.Cycler object>"; }
  std::string_view type_name() const override { return "Cycler"; }
  Value attribute(const Value& self, std::string_view name) override {
    if (name == "current") return items[pos];
    auto me = shared_from_this();
    if (name == "next")
      return make_fn("next", [me](Interpreter&, CallArgs&) {
        Value v = me->items[me->pos];
        me->pos = (me->pos + 1) % me->items.size();
        return v;
      });
    if (name == "reset")
      return make_fn("reset", [me](Interpreter&, CallArgs&) {
        me->pos = 0;
        return Value::none();
      });
    return Callable::attribute(self, name);
  }
  std::vector<Value> items;
  size_t pos = 0;
};

}  // namespace

void add_globals(Interpreter& in) {
  in.set_global("range", make_fn("range", range_fn));
  in.set_global("dict", make_fn("dict", [](Interpreter& it, CallArgs& a) {
    return it.make_dict(dict_from_args(it, a, "dict"));
  }));
  in.set_global("namespace", make_fn("namespace", [](Interpreter& it, CallArgs& a) {
    auto ns = it.make_namespace();
    ns->attrs = dict_from_args(it, a, "namespace");
    return Value(ns);
  }));
  in.set_global("joiner", make_fn("joiner", [](Interpreter&, CallArgs& a) {
    ArgBinder b("joiner", a, {"sep"});
    std::string sep = b.given(0) ? to_str(b[0]) : ", ";
    return Value(std::shared_ptr<Callable>(std::make_shared<Joiner>(sep)));
  }));
  in.set_global("cycler", make_fn("cycler", [](Interpreter&, CallArgs& a) {
    if (a.args.empty()) type_error("at least one item has to be provided");
    return Value(std::shared_ptr<Callable>(std::make_shared<Cycler>(a.args)));
  }));
  in.set_global("raise_exception", make_fn("raise_exception", [](Interpreter&, CallArgs& a) -> Value {
    ArgBinder b("raise_exception", a, {"message"});
    raise(ErrorKind::Raised, to_str(b[0]));
  }));
  in.set_global("strftime_now", make_fn("strftime_now", [](Interpreter& it, CallArgs& a) {
    ArgBinder b("strftime_now", a, {"format"});
    std::string fmt = str_arg(b[0], "format");
    std::time_t t = std::time_t(it.now_unix_seconds());
    std::tm tm{};
    if (it.fixed_clock()) gmtime_r(&t, &tm);
    else localtime_r(&t, &tm);
    if (fmt.empty()) return Value("");
    std::string out(fmt.size() * 8 + 64, '\0');
    size_t n = std::strftime(out.data(), out.size(), fmt.c_str(), &tm);
    out.resize(n);
    return it.make_string(std::move(out));
  }));
}

}  // namespace muse::jinja
