// Syntax tree of a parsed Jinja template (mirrors jinja2.nodes).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "muse/jinja/value.h"

namespace muse::jinja {

class Interpreter;
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

using FilterFn = Value (*)(Interpreter& in, const Value& input, CallArgs& args);
using TestFn = bool (*)(Interpreter& in, const Value& input, CallArgs& args);

enum class ExprKind {
  Const, Name, List, Tuple, Dict, Getattr, Getitem, Slice, Call, Filter, Test,
  Not, Neg, Pos, Binary, And, Or, Concat, Compare, CondExpr, NSRef,
};

struct Expr {
  Expr(ExprKind k, int l) : kind(k), line(l) {}
  virtual ~Expr() = default;
  ExprKind kind;
  int line;
};
using ExprPtr = std::unique_ptr<Expr>;

struct ConstExpr : Expr {
  ConstExpr(Value v, int l) : Expr(ExprKind::Const, l), value(std::move(v)) {}
  Value value;
};
struct NameExpr : Expr {
  NameExpr(std::string n, int l) : Expr(ExprKind::Name, l), name(std::move(n)) {}
  std::string name;
};
struct SeqExpr : Expr {  // List or Tuple literal, or an unpacking target tuple
  using Expr::Expr;
  std::vector<ExprPtr> items;
};
struct DictExpr : Expr {
  explicit DictExpr(int l) : Expr(ExprKind::Dict, l) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> pairs;
};
struct GetattrExpr : Expr {
  GetattrExpr(ExprPtr o, std::string a, int l) : Expr(ExprKind::Getattr, l), obj(std::move(o)), attr(std::move(a)) {}
  ExprPtr obj;
  std::string attr;
};
struct GetitemExpr : Expr {
  GetitemExpr(ExprPtr o, ExprPtr i, int l) : Expr(ExprKind::Getitem, l), obj(std::move(o)), index(std::move(i)) {}
  ExprPtr obj, index;
};
struct SliceExpr : Expr {
  explicit SliceExpr(int l) : Expr(ExprKind::Slice, l) {}
  ExprPtr start, stop, step;  // each may be null
};
struct ArgList {
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr dyn_args, dyn_kwargs;
};
struct CallExpr : Expr {
  explicit CallExpr(int l) : Expr(ExprKind::Call, l) {}
  ExprPtr callee;
  ArgList args;
};
struct FilterExpr : Expr {
  explicit FilterExpr(int l) : Expr(ExprKind::Filter, l) {}
  ExprPtr node;  // null inside {% filter %} and {% set x | f %}: the block's output
  std::string name;
  FilterFn fn = nullptr;
  ArgList args;
};
struct TestExpr : Expr {
  explicit TestExpr(int l) : Expr(ExprKind::Test, l) {}
  ExprPtr node;
  std::string name;
  TestFn fn = nullptr;
  ArgList args;
};
struct UnaryExpr : Expr {  // Not, Neg, Pos
  UnaryExpr(ExprKind k, ExprPtr o, int l) : Expr(k, l), operand(std::move(o)) {}
  ExprPtr operand;
};
enum class BinOp { Add, Sub, Mul, Div, FloorDiv, Mod, Pow };
struct BinaryExpr : Expr {  // Binary (with op), And, Or
  BinaryExpr(ExprKind k, BinOp o, ExprPtr a, ExprPtr b, int l)
      : Expr(k, l), op(o), left(std::move(a)), right(std::move(b)) {}
  BinOp op;
  ExprPtr left, right;
};
struct ConcatExpr : Expr {
  explicit ConcatExpr(int l) : Expr(ExprKind::Concat, l) {}
  std::vector<ExprPtr> items;
};
enum class CmpOp { Eq, Ne, Lt, Le, Gt, Ge, In, NotIn };
struct CompareExpr : Expr {
  explicit CompareExpr(int l) : Expr(ExprKind::Compare, l) {}
  ExprPtr first;
  std::vector<std::pair<CmpOp, ExprPtr>> ops;
};
struct CondExpr : Expr {
  explicit CondExpr(int l) : Expr(ExprKind::CondExpr, l) {}
  ExprPtr test, then, otherwise;  // otherwise may be null: undefined
};
struct NSRefExpr : Expr {  // `ns.attr` as an assignment target
  NSRefExpr(std::string n, std::string a, int l) : Expr(ExprKind::NSRef, l), name(std::move(n)), attr(std::move(a)) {}
  std::string name, attr;
};

// ---------------------------------------------------------------------------
// Statements
// ---------------------------------------------------------------------------

enum class StmtKind { Output, For, If, Set, SetBlock, Macro, CallBlock, FilterBlock, With, Break, Continue, Scope, Unsupported };

struct Stmt {
  Stmt(StmtKind k, int l) : kind(k), line(l) {}
  virtual ~Stmt() = default;
  StmtKind kind;
  int line;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct OutputItem {
  std::string text;  // template data, when expr is null
  ExprPtr expr;
};
struct OutputStmt : Stmt {
  explicit OutputStmt(int l) : Stmt(StmtKind::Output, l) {}
  std::vector<OutputItem> items;
};
struct ForStmt : Stmt {
  explicit ForStmt(int l) : Stmt(StmtKind::For, l) {}
  ExprPtr target, iter, filter;
  bool recursive = false;
  bool uses_loop = true;
  Body body, else_body;
};
struct IfStmt : Stmt {
  explicit IfStmt(int l) : Stmt(StmtKind::If, l) {}
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body else_body;
};
struct SetStmt : Stmt {
  explicit SetStmt(int l) : Stmt(StmtKind::Set, l) {}
  ExprPtr target, value;
};
struct SetBlockStmt : Stmt {
  explicit SetBlockStmt(int l) : Stmt(StmtKind::SetBlock, l) {}
  ExprPtr target, filter;  // filter may be null
  Body body;
};
// A macro, or the body of a {% call %} block (the `caller`).
struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  Body body;
  bool uses_varargs = false, uses_kwargs = false, uses_caller = false;
};
struct MacroStmt : Stmt {
  explicit MacroStmt(int l) : Stmt(StmtKind::Macro, l) {}
  MacroDef def;
};
struct CallBlockStmt : Stmt {
  explicit CallBlockStmt(int l) : Stmt(StmtKind::CallBlock, l) {}
  ExprPtr call;  // a CallExpr
  MacroDef caller;
};
struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(int l) : Stmt(StmtKind::FilterBlock, l) {}
  ExprPtr filter;
  Body body;
};
struct WithStmt : Stmt {
  explicit WithStmt(int l) : Stmt(StmtKind::With, l) {}
  std::vector<ExprPtr> targets, values;
  Body body;
};
// {% block %}, {% generation %} (transformers' AssistantTracker), {% autoescape %}:
// the body renders in place.
struct ScopeStmt : Stmt {
  ScopeStmt(int l, bool scoped_) : Stmt(StmtKind::Scope, l), scoped(scoped_) {}
  bool scoped;
  Body body;
};
// include/import/extends: parsed like jinja2, but there is no loader (as in
// transformers), so executing one is an error.
struct UnsupportedStmt : Stmt {
  UnsupportedStmt(int l, std::string m) : Stmt(StmtKind::Unsupported, l), message(std::move(m)) {}
  std::string message;
};

struct TemplateAst {
  Body body;
};

}  // namespace muse::jinja
