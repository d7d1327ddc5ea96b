// Tree-walking evaluator for TemplateAst, with jinja2's scoping (a for loop
// iteration, macro call or with block opens a scope; if blocks do not),
// sandbox rules and rendering limits.
//
// Everything here runs inside Template::render, which catches the internal
// TemplateRuntimeError; built-ins call back into the Interpreter for
// attribute lookup, calls, work accounting and value construction.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "muse/jinja/ast.h"
#include "muse/jinja/error.h"
#include "muse/jinja/value.h"

namespace muse::jinja {

// Bounds on one render, so a hostile template cannot hang or exhaust memory.
struct RenderLimits {
  uint64_t max_steps = 20'000'000;         // statements + expression nodes + loop iterations
  uint64_t max_work_bytes = 1ull << 30;    // bytes of strings and list slots built, in total
  size_t max_output_bytes = 64u << 20;     // size of any one output buffer or string
  int max_call_depth = 100;                // nested macro calls / recursive loops
  int max_value_depth = 200;               // nesting of lists/dicts/namespaces
  // Native stack the render may use: nesting and recursion are also bounded
  // by what they cost, so deep-but-legal combinations cannot overflow it.
  size_t max_stack_bytes = 2u << 20;
};

struct Frame {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Frame> parent;
  const Value* find(std::string_view name) const;
  Value* find_local(std::string_view name);
  void set(std::string_view name, Value v);
};
using FramePtr = std::shared_ptr<Frame>;

struct LoopData {
  std::vector<Value> items;  // the iterated (and filtered) sequence
  int64_t index0 = 0;
  int64_t length = 0;
  int depth0 = 0;
  bool has_changed_value = false;
  Value changed_value;
  const ForStmt* stmt = nullptr;  // for recursive loops: loop(children)
  FramePtr frame;                 // the scope the loop statement runs in
};

class Interpreter {
 public:
  Interpreter(const RenderLimits& limits, std::optional<int64_t> now_unix_seconds);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  void set_global(std::string_view name, Value v) { globals_->set(name, std::move(v)); }
  std::string render(const TemplateAst& ast);

  // ---- services for built-ins ---------------------------------------------
  Value call(const Value& callee, CallArgs& args);
  Value getattr(const Value& obj, std::string_view attr);
  Value getitem(const Value& obj, const Value& key);
  // Iterating a value the Python way: lists, dict keys, string characters;
  // undefined iterates as empty; others are a TypeError.
  std::vector<Value> iterate(const Value& v);
  Value apply_filter(std::string_view name, const Value& v, CallArgs& args);
  bool apply_test(std::string_view name, const Value& v, CallArgs& args);
  void step(uint64_t n = 1);
  void check_stack() const;
  void charge(uint64_t bytes);
  // A string result: checks the size limits first.
  Value make_string(std::string s);
  Value make_list(std::vector<Value> items, ListKind kind = ListKind::List);
  Value make_dict(DictData d);
  std::shared_ptr<NamespaceData> make_namespace();
  const RenderLimits& limits() const { return limits_; }
  int64_t now_unix_seconds() const;
  bool fixed_clock() const { return now_.has_value(); }
  int current_line() const { return line_; }

  // Used by the macro callable.
  struct MacroCallable;
  Value call_macro(const MacroDef& def, const FramePtr& closure, CallArgs& args, const Value& caller);

 private:
  enum class Flow { Normal, Break, Continue };

  FramePtr new_frame(FramePtr parent);
  Flow exec_body(const Body& body, const FramePtr& frame, std::string& out);
  Flow exec(const Stmt& s, const FramePtr& frame, std::string& out);
  void exec_for(const ForStmt& s, const FramePtr& frame, std::string& out, const Value& iterable, int depth0);
  void exec_if(const IfStmt& s, const FramePtr& frame, std::string& out, Flow* flow);
  void assign(const Expr& target, const Value& value, const FramePtr& frame);
  Value define_macro(const MacroDef& def, const FramePtr& frame);
  Value apply_filter_chain(const Expr& filter, const Value& input, const FramePtr& frame);
  void append_output(std::string& out, std::string_view text);

  Value eval(const Expr& e, const FramePtr& frame);
  Value eval_name(const NameExpr& e, const FramePtr& frame);
  Value eval_getitem(const GetitemExpr& e, const FramePtr& frame);
  Value eval_call(const CallExpr& e, const FramePtr& frame);
  CallArgs eval_args(const ArgList& a, const FramePtr& frame);
  Value eval_binary(BinOp op, const Value& a, const Value& b);
  bool eval_compare(CmpOp op, const Value& a, const Value& b);
  Value slice(const Value& obj, const SliceExpr& s, const FramePtr& frame);

  RenderLimits limits_;
  std::optional<int64_t> now_;
  FramePtr globals_;
  uint64_t steps_ = 0;
  uint64_t work_ = 0;
  int call_depth_ = 0;
  int line_ = 0;
  uintptr_t stack_base_ = 0;
  // Frames captured by macros and recursive loops, and namespaces, can form
  // reference cycles (a macro stored in the scope it closes over, a namespace
  // holding itself) and arbitrarily long chains. They are held here until
  // the render ends, then emptied before being released, so nothing leaks
  // and no destructor recurses deeply.
  std::vector<FramePtr> captured_frames_;
  std::vector<std::shared_ptr<NamespaceData>> namespaces_;
  std::vector<std::shared_ptr<LoopData>> loops_;
};

// Python binary operators on values (also used by filters such as sum).
Value python_add(Interpreter& in, const Value& a, const Value& b);
// Python's `x in container`.
bool python_contains(const Value& container, const Value& needle);
// Python's printf-style `fmt % args`.
std::string python_percent_format(Interpreter& in, const std::string& fmt, const Value& args);

}  // namespace muse::jinja
