// Statements, scopes, macros and calls. Expressions are in eval.cc.
#include "muse/jinja/interpreter.h"

#include <ctime>

#include "muse/jinja/builtins.h"

namespace muse::jinja {

// ---------------------------------------------------------------------------
// Frames
// ---------------------------------------------------------------------------

const Value* Frame::find(std::string_view name) const {
  for (const Frame* f = this; f; f = f->parent.get())
    for (const auto& [k, v] : f->vars)
      if (k == name) return &v;
  return nullptr;
}

Value* Frame::find_local(std::string_view name) {
  for (auto& [k, v] : vars)
    if (k == name) return &v;
  return nullptr;
}

void Frame::set(std::string_view name, Value v) {
  if (Value* slot = find_local(name)) {
    *slot = std::move(v);
    return;
  }
  vars.emplace_back(std::string(name), std::move(v));
}

// ---------------------------------------------------------------------------
// Macros
// ---------------------------------------------------------------------------

struct Interpreter::MacroCallable : Callable {
  MacroCallable(const MacroDef* d, FramePtr c, Value caller_) : def(d), closure(std::move(c)), caller(std::move(caller_)) {}
  Value call(Interpreter& in, CallArgs& args) override { return in.call_macro(*def, closure, args, caller); }
  std::string repr() const override { return "<Macro '" + def->name + "'>"; }
  std::string_view type_name() const override { return "Macro"; }
  const MacroDef* def;
  FramePtr closure;
  Value caller;
};

Value Interpreter::define_macro(const MacroDef& def, const FramePtr& frame) {
  // The closure frame may end up holding the macro itself: keep it for the
  // end-of-render cleanup that breaks such cycles.
  if (captured_frames_.empty() || captured_frames_.back() != frame) captured_frames_.push_back(frame);
  return Value(std::shared_ptr<Callable>(std::make_shared<MacroCallable>(&def, frame, Value())));
}

Value Interpreter::call_macro(const MacroDef& def, const FramePtr& closure, CallArgs& args, const Value& caller) {
  if (call_depth_ >= limits_.max_call_depth)
    raise(ErrorKind::Limit, "maximum macro call depth (" + std::to_string(limits_.max_call_depth) + ") exceeded");
  FramePtr f = new_frame(closure);
  size_t np = def.params.size();
  std::vector<bool> bound(np, false);
  std::vector<Value> extra;
  for (size_t i = 0; i < args.args.size(); ++i) {
    if (i < np) {
      f->set(def.params[i], args.args[i]);
      bound[i] = true;
    } else if (def.uses_varargs) {
      extra.push_back(args.args[i]);
    } else {
      type_error("macro '" + def.name + "' takes not more than " + std::to_string(np) + " argument(s)");
    }
  }
  DictData kw;
  Value caller_value = caller;
  for (auto& [k, v] : args.kwargs) {
    size_t idx = np;
    for (size_t i = 0; i < np; ++i)
      if (def.params[i] == k) idx = i;
    if (idx < np) {
      if (bound[idx]) type_error("macro '" + def.name + "' got multiple values for argument '" + k + "'");
      f->set(k, v);
      bound[idx] = true;
    } else if (k == "caller" && def.uses_caller) {
      caller_value = v;
    } else if (def.uses_kwargs) {
      kw.set(Value(k), v);
    } else {
      type_error("macro '" + def.name + "' takes no keyword argument '" + k + "'");
    }
  }
  size_t first_default = np - def.defaults.size();
  for (size_t i = 0; i < np; ++i) {
    if (bound[i]) continue;
    if (i >= first_default)
      f->set(def.params[i], eval(*def.defaults[i - first_default], f));
    else
      f->set(def.params[i], Value::undefined("parameter '" + def.params[i] + "' was not provided"));
  }
  if (def.uses_varargs) f->set("varargs", make_list(std::move(extra), ListKind::Tuple));
  if (def.uses_kwargs) f->set("kwargs", make_dict(std::move(kw)));
  if (def.uses_caller) {
    f->set("caller", caller_value.is_undefined() ? Value::undefined("No caller defined") : caller_value);
  }
  ++call_depth_;
  int saved_line = line_;
  std::string out;
  exec_body(def.body, f, out);
  line_ = saved_line;
  --call_depth_;
  return make_string(std::move(out));
}

// ---------------------------------------------------------------------------
// Interpreter
// ---------------------------------------------------------------------------

Interpreter::Interpreter(const RenderLimits& limits, std::optional<int64_t> now) : limits_(limits), now_(now) {
  globals_ = std::make_shared<Frame>();
  add_globals(*this);
}

Interpreter::~Interpreter() {
  // Break reference cycles (scope -> macro -> scope, namespace -> itself)
  // without recursive cascades: empty every tracked container first, while
  // the strong references below keep them alive, then let them go.
  for (auto& f : captured_frames_) {
    f->vars.clear();
    f->parent.reset();
  }
  for (auto& ns : namespaces_) ns->attrs.items.clear();
  for (auto& l : loops_) {
    l->frame.reset();
    l->changed_value = Value();
  }
  captured_frames_.clear();
  namespaces_.clear();
  loops_.clear();
}

FramePtr Interpreter::new_frame(FramePtr parent) {
  auto f = std::make_shared<Frame>();
  f->parent = std::move(parent);
  return f;
}

int64_t Interpreter::now_unix_seconds() const { return now_ ? *now_ : int64_t(std::time(nullptr)); }

void Interpreter::step(uint64_t n) {
  steps_ += n;
  if (steps_ > limits_.max_steps)
    raise(ErrorKind::Limit, "template exceeded the step limit (" + std::to_string(limits_.max_steps) + ")");
}

void Interpreter::check_stack() const {
  // The frame address, not a local's: sanitizers may move locals off the stack.
  auto here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  if (stack_base_ > here && stack_base_ - here > limits_.max_stack_bytes)
    raise(ErrorKind::Limit, "template nesting and recursion too deep (stack limit " +
                                std::to_string(limits_.max_stack_bytes) + " bytes)");
}

void Interpreter::charge(uint64_t bytes) {
  work_ += bytes;
  if (work_ > limits_.max_work_bytes)
    raise(ErrorKind::Limit, "template exceeded the work limit (" + std::to_string(limits_.max_work_bytes) + " bytes built)");
}

Value Interpreter::make_string(std::string s) {
  if (s.size() > limits_.max_output_bytes)
    raise(ErrorKind::Limit, "string longer than the output limit (" + std::to_string(limits_.max_output_bytes) + " bytes)");
  charge(s.size());
  return Value(std::move(s));
}

Value Interpreter::make_list(std::vector<Value> items, ListKind kind) {
  charge(items.size() * sizeof(Value));
  Value v = Value::list(std::move(items), kind);
  if (v.depth() > limits_.max_value_depth)
    raise(ErrorKind::Limit, "value nesting deeper than " + std::to_string(limits_.max_value_depth));
  return v;
}

Value Interpreter::make_dict(DictData d) {
  charge(d.items.size() * 2 * sizeof(Value));
  Value v = Value::dict(std::move(d));
  if (v.depth() > limits_.max_value_depth)
    raise(ErrorKind::Limit, "value nesting deeper than " + std::to_string(limits_.max_value_depth));
  return v;
}

std::shared_ptr<NamespaceData> Interpreter::make_namespace() {
  auto ns = std::make_shared<NamespaceData>();
  namespaces_.push_back(ns);
  return ns;
}

void Interpreter::append_output(std::string& out, std::string_view text) {
  if (out.size() + text.size() > limits_.max_output_bytes)
    raise(ErrorKind::Limit, "output longer than the limit (" + std::to_string(limits_.max_output_bytes) + " bytes)");
  charge(text.size());
  out.append(text);
}

std::string Interpreter::render(const TemplateAst& ast) {
  stack_base_ = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  std::string out;
  FramePtr root = new_frame(globals_);
  exec_body(ast.body, root, out);
  return out;
}

Interpreter::Flow Interpreter::exec_body(const Body& body, const FramePtr& frame, std::string& out) {
  for (const auto& s : body) {
    Flow f = exec(*s, frame, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, const FramePtr& frame, std::string& out) {
  step();
  check_stack();
  line_ = s.line;
  switch (s.kind) {
    case StmtKind::Output: {
      for (const auto& item : static_cast<const OutputStmt&>(s).items) {
        if (!item.expr) {
          append_output(out, item.text);
          continue;
        }
        line_ = item.expr->line;
        Value v = eval(*item.expr, frame);
        if (v.is_string()) {
          append_output(out, v.as_string());
        } else {
          std::string text;
          append_str(text, v);
          append_output(out, text);
        }
      }
      return Flow::Normal;
    }
    case StmtKind::For: {
      const auto& f = static_cast<const ForStmt&>(s);
      Value iterable = eval(*f.iter, frame);
      exec_for(f, frame, out, iterable, 0);
      return Flow::Normal;
    }
    case StmtKind::If: {
      Flow flow = Flow::Normal;
      exec_if(static_cast<const IfStmt&>(s), frame, out, &flow);
      return flow;
    }
    case StmtKind::Set: {
      const auto& st = static_cast<const SetStmt&>(s);
      assign(*st.target, eval(*st.value, frame), frame);
      return Flow::Normal;
    }
    case StmtKind::SetBlock: {
      const auto& st = static_cast<const SetBlockStmt&>(s);
      std::string buf;
      exec_body(st.body, new_frame(frame), buf);
      Value v = make_string(std::move(buf));
      if (st.filter) v = apply_filter_chain(*st.filter, v, frame);
      assign(*st.target, v, frame);
      return Flow::Normal;
    }
    case StmtKind::Macro: {
      const auto& m = static_cast<const MacroStmt&>(s);
      frame->set(m.def.name, define_macro(m.def, frame));
      return Flow::Normal;
    }
    case StmtKind::CallBlock: {
      const auto& cb = static_cast<const CallBlockStmt&>(s);
      if (captured_frames_.empty() || captured_frames_.back() != frame) captured_frames_.push_back(frame);
      Value caller(std::shared_ptr<Callable>(std::make_shared<MacroCallable>(&cb.caller, frame, Value())));
      const auto& call = static_cast<const CallExpr&>(*cb.call);
      Value callee = eval(*call.callee, frame);
      CallArgs args = eval_args(call.args, frame);
      args.kwargs.emplace_back("caller", caller);
      Value result = this->call(callee, args);
      append_output(out, to_str(result));
      return Flow::Normal;
    }
    case StmtKind::FilterBlock: {
      const auto& fb = static_cast<const FilterBlockStmt&>(s);
      std::string buf;
      exec_body(fb.body, new_frame(frame), buf);
      Value v = apply_filter_chain(*fb.filter, make_string(std::move(buf)), frame);
      append_output(out, to_str(v));
      return Flow::Normal;
    }
    case StmtKind::With: {
      const auto& w = static_cast<const WithStmt&>(s);
      FramePtr inner = new_frame(frame);
      for (size_t i = 0; i < w.targets.size(); ++i) assign(*w.targets[i], eval(*w.values[i], frame), inner);
      return exec_body(w.body, inner, out);
    }
    case StmtKind::Break: return Flow::Break;
    case StmtKind::Continue: return Flow::Continue;
    case StmtKind::Scope: {
      const auto& sc = static_cast<const ScopeStmt&>(s);
      return exec_body(sc.body, new_frame(frame), out);
    }
    case StmtKind::Unsupported: type_error(static_cast<const UnsupportedStmt&>(s).message);
  }
  return Flow::Normal;
}

void Interpreter::exec_if(const IfStmt& s, const FramePtr& frame, std::string& out, Flow* flow) {
  for (const auto& [test, body] : s.branches) {
    line_ = test->line;
    if (truthy(eval(*test, frame))) {
      *flow = exec_body(body, frame, out);
      return;
    }
  }
  *flow = exec_body(s.else_body, frame, out);
}

void Interpreter::exec_for(const ForStmt& s, const FramePtr& frame, std::string& out, const Value& iterable,
                           int depth0) {
  std::vector<Value> items = iterate(iterable);
  if (s.filter) {
    std::vector<Value> kept;
    for (auto& item : items) {
      step();
      FramePtr probe = new_frame(frame);
      assign(*s.target, item, probe);
      if (truthy(eval(*s.filter, probe))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    exec_body(s.else_body, new_frame(frame), out);
    return;
  }
  auto loop = std::make_shared<LoopData>();
  loop->length = int64_t(items.size());
  loop->depth0 = depth0;
  loop->stmt = &s;
  if (s.recursive) {
    loop->frame = frame;
    loops_.push_back(loop);
  }
  loop->items = std::move(items);
  Value loop_value(loop);
  for (size_t i = 0; i < loop->items.size(); ++i) {
    step();
    loop->index0 = int64_t(i);
    FramePtr it = new_frame(frame);
    it->set("loop", loop_value);
    assign(*s.target, loop->items[i], it);
    Flow f = exec_body(s.body, it, out);
    if (f == Flow::Break) break;
  }
}

Value Interpreter::apply_filter_chain(const Expr& filter, const Value& input, const FramePtr& frame) {
  const auto& f = static_cast<const FilterExpr&>(filter);
  Value in = f.node ? apply_filter_chain(*f.node, input, frame) : input;
  if (!f.fn) type_error("No filter named '" + f.name + "'.");
  CallArgs args = eval_args(f.args, frame);
  line_ = f.line;
  return f.fn(*this, in, args);
}

void Interpreter::assign(const Expr& target, const Value& value, const FramePtr& frame) {
  switch (target.kind) {
    case ExprKind::Name: frame->set(static_cast<const NameExpr&>(target).name, value); return;
    case ExprKind::Tuple: {
      const auto& names = static_cast<const SeqExpr&>(target).items;
      std::vector<Value> items = iterate(value);
      if (items.size() > names.size())
        type_error("too many values to unpack (expected " + std::to_string(names.size()) + ")");
      if (items.size() < names.size())
        type_error("not enough values to unpack (expected " + std::to_string(names.size()) + ", got " +
                   std::to_string(items.size()) + ")");
      for (size_t i = 0; i < names.size(); ++i) assign(*names[i], items[i], frame);
      return;
    }
    case ExprKind::NSRef: {
      const auto& ref = static_cast<const NSRefExpr&>(target);
      const Value* ns = frame->find(ref.name);
      if (!ns || !ns->is_namespace()) type_error("Can only set attributes on namespace objects.");
      ns->as_namespace().attrs.set(Value(ref.attr), value);
      return;
    }
    default: type_error("can't assign to this expression");
  }
}

// ---------------------------------------------------------------------------
// Calls
// ---------------------------------------------------------------------------

Value Interpreter::call(const Value& callee, CallArgs& args) {
  step();
  switch (callee.kind()) {
    case Value::Kind::Callable: return callee.as_callable().call(*this, args);
    case Value::Kind::Loop: {
      LoopData& loop = callee.as_loop();
      if (!loop.stmt || !loop.stmt->recursive || !loop.frame)
        type_error("Tried to call non recursive loop. Maybe you forgot the 'recursive' modifier.");
      if (args.args.size() != 1 || !args.kwargs.empty()) type_error("loop() takes exactly one argument");
      if (call_depth_ >= limits_.max_call_depth)
        raise(ErrorKind::Limit, "maximum recursion depth (" + std::to_string(limits_.max_call_depth) + ") exceeded");
      ++call_depth_;
      std::string out;
      exec_for(*loop.stmt, loop.frame, out, args.args[0], loop.depth0 + 1);
      --call_depth_;
      return make_string(std::move(out));
    }
    case Value::Kind::Undefined: {
      const UndefinedInfo* info = callee.undefined_info();
      raise(info && info->security ? ErrorKind::Security : ErrorKind::Undefined,
            info ? info->message : "value is undefined");
    }
    default: type_error("'" + type_name(callee) + "' object is not callable");
  }
}

CallArgs Interpreter::eval_args(const ArgList& a, const FramePtr& frame) {
  CallArgs out;
  for (const auto& e : a.args) out.args.push_back(eval(*e, frame));
  if (a.dyn_args) {
    for (auto& v : iterate(eval(*a.dyn_args, frame))) out.args.push_back(std::move(v));
  }
  for (const auto& [k, e] : a.kwargs) out.kwargs.emplace_back(k, eval(*e, frame));
  if (a.dyn_kwargs) {
    Value d = eval(*a.dyn_kwargs, frame);
    if (!d.is_dict()) type_error("argument after ** must be a mapping, not " + type_name(d));
    for (const auto& [k, v] : d.as_dict().items) {
      if (!k.is_string()) type_error("keywords must be strings");
      out.kwargs.emplace_back(k.as_string(), v);
    }
  }
  return out;
}

}  // namespace muse::jinja
