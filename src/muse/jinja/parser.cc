#include "muse/jinja/parser.h"

#include <initializer_list>

#include "muse/jinja/builtins.h"
#include "muse/jinja/lexer.h"

namespace muse::jinja {
namespace {

struct ParseError {
  std::string message;
  int line;
};

class Parser {
 public:
  Parser(std::vector<Token> tokens, const ParseOptions& o) : t_(std::move(tokens)), opt_(o) {}

  TemplateAst run() {
    TemplateAst ast;
    ast.body = subparse({});
    return ast;
  }

 private:
  // ---- token stream -------------------------------------------------------
  const Token& cur() const { return t_[pos_]; }
  const Token& look() const { return t_[pos_ + 1 < t_.size() ? pos_ + 1 : pos_]; }
  const Token& next() {
    const Token& tok = t_[pos_];
    if (pos_ + 1 < t_.size()) ++pos_;
    return tok;
  }
  bool is_op(std::string_view op) const { return cur().type == TokenType::Operator && cur().value == op; }
  bool is_name(std::string_view n) const { return cur().type == TokenType::Name && cur().value == n; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail(std::string msg, int line = -1) {
    throw ParseError{std::move(msg), line < 0 ? cur().line : line};
  }
  std::string describe_current() const {
    const Token& c = cur();
    return describe_token(c);
  }
  const Token& expect_type(TokenType type) {
    if (cur().type != type) {
      if (cur().type == TokenType::Eof)
        fail(std::string("unexpected end of template, expected '") + token_type_name(type) + "'.");
      fail(std::string("expected token '") + token_type_name(type) + "', got '" + describe_current() + "'");
    }
    return next();
  }
  void expect_op(std::string_view op) {
    if (!is_op(op)) {
      if (cur().type == TokenType::Eof) fail("unexpected end of template, expected '" + std::string(op) + "'.");
      fail("expected token '" + std::string(op) + "', got '" + describe_current() + "'");
    }
    next();
  }
  void expect_name(std::string_view n) {
    if (!is_name(n)) fail("expected token '" + std::string(n) + "', got '" + describe_current() + "'");
    next();
  }

  struct DepthGuard {
    Parser* p;
    explicit DepthGuard(Parser* parser) : p(parser) {
      if (++p->depth_ > p->opt_.max_nesting) p->fail("template nesting is too deep");
    }
    ~DepthGuard() { --p->depth_; }
  };

  // ---- statements ---------------------------------------------------------
  bool at_end_tag(std::initializer_list<std::string_view> ends) const {
    if (cur().type != TokenType::Name) return false;
    for (auto e : ends)
      if (cur().value == e) return true;
    return false;
  }

  // Parses until a block tag named in `ends` (left as the current token).
  Body subparse(std::initializer_list<std::string_view> ends) {
    Body body;
    std::unique_ptr<OutputStmt> out;
    auto flush = [&] {
      if (out) body.push_back(std::move(out));
      out.reset();
    };
    while (cur().type != TokenType::Eof) {
      const Token& tok = cur();
      if (tok.type == TokenType::Data) {
        if (!out) out = std::make_unique<OutputStmt>(tok.line);
        out->items.push_back(OutputItem{tok.value, nullptr});
        next();
      } else if (tok.type == TokenType::VariableBegin) {
        int line = next().line;
        if (!out) out = std::make_unique<OutputStmt>(line);
        out->items.push_back(OutputItem{"", parse_tuple(false, true, {}, false)});
        expect_type(TokenType::VariableEnd);
      } else if (tok.type == TokenType::BlockBegin) {
        flush();
        next();
        if (ends.size() && at_end_tag(ends)) return body;
        body.push_back(parse_statement());
        expect_type(TokenType::BlockEnd);
      } else {
        fail("internal parsing error");
      }
    }
    flush();
    if (ends.size()) fail_eof(ends);
    return body;
  }

  [[noreturn]] void fail_eof(std::initializer_list<std::string_view> ends) {
    std::string msg = "Unexpected end of template.";
    std::string looking;
    for (auto e : ends) looking += (looking.empty() ? "'" : " or '") + std::string(e) + "'";
    if (!looking.empty()) msg += " Jinja was looking for the following tags: " + looking + ".";
    if (!tag_stack_.empty()) msg += " The innermost block that needs to be closed is '" + tag_stack_.back() + "'.";
    fail(msg);
  }

  Body parse_statements(std::initializer_list<std::string_view> ends, bool drop_needle) {
    skip_op(":");
    expect_type(TokenType::BlockEnd);
    Body body = subparse(ends);
    if (drop_needle) next();
    return body;
  }

  StmtPtr parse_statement() {
    DepthGuard guard(this);
    const Token& tok = cur();
    if (tok.type != TokenType::Name) fail("tag name expected");
    std::string name = tok.value;
    int line = tok.line;
    tag_stack_.push_back(name);
    StmtPtr s;
    if (name == "for") s = parse_for();
    else if (name == "if") s = parse_if();
    else if (name == "set") s = parse_set();
    else if (name == "macro") s = parse_macro();
    else if (name == "call") s = parse_call_block();
    else if (name == "filter") s = parse_filter_block();
    else if (name == "with") s = parse_with();
    else if (name == "print") s = parse_print();
    else if (name == "block") s = parse_block();
    else if (name == "autoescape") s = parse_scope_with_expr("endautoescape");
    else if (name == "generation") s = parse_generation();
    else if (name == "break" || name == "continue") {
      next();
      if (loop_depth_ == 0) fail("'" + name + "' outside loop", line);
      s = std::make_unique<Stmt>(name == "break" ? StmtKind::Break : StmtKind::Continue, line);
    } else if (name == "extends" || name == "include" || name == "import" || name == "from") {
      s = parse_loader_statement(name);
    } else {
      tag_stack_.pop_back();
      fail("Encountered unknown tag '" + name + "'.", line);
    }
    tag_stack_.pop_back();
    return s;
  }

  StmtPtr parse_for() {
    auto s = std::make_unique<ForStmt>(next().line);
    s->target = parse_assign_target(true, false, {"in"}, false);
    expect_name("in");
    s->iter = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) s->filter = parse_expression(true);
    s->recursive = skip_name("recursive");
    bool saved_soft = soft_;
    soft_ = false;
    ++loop_depth_;
    s->body = parse_statements({"endfor", "else"}, false);
    --loop_depth_;
    if (next().value == "else") s->else_body = parse_statements({"endfor"}, true);
    soft_ = saved_soft;
    return s;
  }

  StmtPtr parse_if() {
    auto s = std::make_unique<IfStmt>(next().line);
    bool saved_soft = soft_;
    soft_ = true;
    while (true) {
      ExprPtr test = parse_tuple(false, false, {}, false);
      Body body = parse_statements({"elif", "else", "endif"}, false);
      s->branches.emplace_back(std::move(test), std::move(body));
      std::string tag = next().value;
      if (tag == "elif") continue;
      if (tag == "else") s->else_body = parse_statements({"endif"}, true);
      break;
    }
    soft_ = saved_soft;
    return s;
  }

  StmtPtr parse_set() {
    int line = next().line;
    ExprPtr target = parse_assign_target(true, false, {}, true);
    if (skip_op("=")) {
      auto s = std::make_unique<SetStmt>(line);
      s->target = std::move(target);
      s->value = parse_tuple(false, true, {}, false);
      return s;
    }
    auto s = std::make_unique<SetBlockStmt>(line);
    s->target = std::move(target);
    s->filter = parse_filter(nullptr, false);
    s->body = parse_statements({"endset"}, true);
    return s;
  }

  void parse_signature(MacroDef& def) {
    expect_op("(");
    while (!is_op(")")) {
      if (!def.params.empty()) expect_op(",");
      const Token& n = expect_type(TokenType::Name);
      def.params.push_back(n.value);
      if (skip_op("=")) {
        def.defaults.push_back(parse_expression(true));
      } else if (!def.defaults.empty()) {
        fail("non-default argument follows default argument");
      }
    }
    expect_op(")");
  }

  // Macro and caller bodies: loop controls and soft frames do not cross them.
  Body parse_macro_body(MacroDef& def, std::string_view end) {
    int saved_loop = loop_depth_;
    bool saved_soft = soft_;
    loop_depth_ = 0;
    soft_ = false;
    macro_stack_.push_back(&def);
    Body b = end == "endmacro" ? parse_statements({"endmacro"}, true) : parse_statements({"endcall"}, true);
    macro_stack_.pop_back();
    loop_depth_ = saved_loop;
    soft_ = saved_soft;
    return b;
  }

  StmtPtr parse_macro() {
    auto s = std::make_unique<MacroStmt>(next().line);
    s->def.name = expect_type(TokenType::Name).value;
    parse_signature(s->def);
    s->def.body = parse_macro_body(s->def, "endmacro");
    return s;
  }

  StmtPtr parse_call_block() {
    auto s = std::make_unique<CallBlockStmt>(next().line);
    s->caller.name = "caller";
    if (is_op("(")) parse_signature(s->caller);
    ExprPtr call = parse_expression(true);
    if (call->kind != ExprKind::Call) fail("expected call", s->line);
    s->call = std::move(call);
    s->caller.body = parse_macro_body(s->caller, "endcall");
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = std::make_unique<FilterBlockStmt>(next().line);
    bool saved_soft = soft_;
    soft_ = false;
    s->filter = parse_filter(nullptr, true);
    s->body = parse_statements({"endfilter"}, true);
    soft_ = saved_soft;
    return s;
  }

  StmtPtr parse_with() {
    auto s = std::make_unique<WithStmt>(next().line);
    while (cur().type != TokenType::BlockEnd) {
      if (!s->targets.empty()) expect_op(",");
      s->targets.push_back(parse_assign_target(true, false, {}, false));
      expect_op("=");
      s->values.push_back(parse_expression(true));
    }
    s->body = parse_statements({"endwith"}, true);
    return s;
  }

  StmtPtr parse_print() {
    auto s = std::make_unique<OutputStmt>(next().line);
    while (cur().type != TokenType::BlockEnd) {
      if (!s->items.empty()) expect_op(",");
      s->items.push_back(OutputItem{"", parse_expression(true)});
    }
    return s;
  }

  StmtPtr parse_block() {
    int line = next().line;
    std::string name = expect_type(TokenType::Name).value;
    bool scoped = skip_name("scoped");
    skip_name("required");
    if (is_op("-"))
      fail("Block names in Jinja have to be valid Python identifiers and may not contain hyphens, use an underscore "
           "instead.");
    auto s = std::make_unique<ScopeStmt>(line, true);
    (void)scoped;
    s->body = parse_statements({"endblock"}, true);
    skip_name(name);
    return s;
  }

  StmtPtr parse_scope_with_expr(std::string_view end) {
    int line = next().line;
    parse_expression(true);  // autoescape's flag: autoescaping stays off (as in transformers)
    auto s = std::make_unique<ScopeStmt>(line, false);
    s->body = parse_statements({end == "endautoescape" ? "endautoescape" : "end"}, true);
    return s;
  }

  StmtPtr parse_generation() {
    auto s = std::make_unique<ScopeStmt>(next().line, false);
    s->body = parse_statements({"endgeneration"}, true);
    return s;
  }

  StmtPtr parse_loader_statement(const std::string& name) {
    int line = next().line;
    parse_expression(true);
    if (name == "import") {
      expect_name("as");
      expect_type(TokenType::Name);
    } else if (name == "from") {
      expect_name("import");
      while (cur().type != TokenType::BlockEnd) next();
    } else if (name == "include") {
      if (is_name("ignore") && look().type == TokenType::Name && look().value == "missing") {
        next();
        next();
      }
    }
    if ((is_name("with") || is_name("without")) && look().value == "context") {
      next();
      next();
    }
    return std::make_unique<UnsupportedStmt>(line, "'" + name + "' needs a template loader, and chat templates have none");
  }

  // ---- assignment targets -------------------------------------------------
  ExprPtr parse_assign_target(bool with_tuple, bool name_only, std::initializer_list<std::string_view> extra_end,
                              bool with_namespace) {
    ExprPtr target;
    if (name_only) {
      const Token& n = expect_type(TokenType::Name);
      target = std::make_unique<NameExpr>(n.value, n.line);
    } else if (with_tuple) {
      target = parse_tuple(true, true, extra_end, false, with_namespace);
    } else {
      target = parse_primary(with_namespace);
    }
    check_assignable(*target);
    return target;
  }

  void check_assignable(const Expr& e) {
    if (e.kind == ExprKind::Name) {
      const auto& n = static_cast<const NameExpr&>(e).name;
      if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None")
        fail("can't assign to 'const'", e.line);
      return;
    }
    if (e.kind == ExprKind::NSRef) return;
    if (e.kind == ExprKind::Tuple) {
      for (const auto& item : static_cast<const SeqExpr&>(e).items) check_assignable(*item);
      return;
    }
    std::string what = e.kind == ExprKind::Const ? "const" : e.kind == ExprKind::List ? "list" : "expression";
    fail("can't assign to '" + what + "'", e.line);
  }

  // ---- expressions --------------------------------------------------------
  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    DepthGuard guard(this);
    int line = cur().line;
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      bool saved_soft = soft_;
      soft_ = true;
      auto c = std::make_unique<CondExpr>(line);
      c->test = parse_or();
      if (skip_name("else")) c->otherwise = parse_condexpr();
      c->then = std::move(expr1);
      expr1 = std::move(c);
      soft_ = saved_soft;
      line = cur().line;
    }
    return expr1;
  }

  ExprPtr parse_or() {
    int line = cur().line;
    ExprPtr left = parse_and();
    while (skip_name("or")) {
      ExprPtr right = parse_and();
      left = std::make_unique<BinaryExpr>(ExprKind::Or, BinOp::Add, std::move(left), std::move(right), line);
      line = cur().line;
    }
    return left;
  }

  ExprPtr parse_and() {
    int line = cur().line;
    ExprPtr left = parse_not();
    while (skip_name("and")) {
      ExprPtr right = parse_not();
      left = std::make_unique<BinaryExpr>(ExprKind::And, BinOp::Add, std::move(left), std::move(right), line);
      line = cur().line;
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(this);
      int line = next().line;
      return std::make_unique<UnaryExpr>(ExprKind::Not, parse_not(), line);
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr expr = parse_math1();
    std::unique_ptr<CompareExpr> cmp;
    while (true) {
      CmpOp op;
      const Token& c = cur();
      if (c.type == TokenType::Operator && c.value == "==") op = CmpOp::Eq;
      else if (c.type == TokenType::Operator && c.value == "!=") op = CmpOp::Ne;
      else if (c.type == TokenType::Operator && c.value == "<") op = CmpOp::Lt;
      else if (c.type == TokenType::Operator && c.value == "<=") op = CmpOp::Le;
      else if (c.type == TokenType::Operator && c.value == ">") op = CmpOp::Gt;
      else if (c.type == TokenType::Operator && c.value == ">=") op = CmpOp::Ge;
      else if (is_name("in")) op = CmpOp::In;
      else if (is_name("not") && look().type == TokenType::Name && look().value == "in") {
        next();
        op = CmpOp::NotIn;
      } else break;
      next();
      if (!cmp) cmp = std::make_unique<CompareExpr>(line);
      cmp->ops.emplace_back(op, parse_math1());
    }
    if (!cmp) return expr;
    cmp->first = std::move(expr);
    return cmp;
  }

  ExprPtr binary(BinOp op, ExprPtr a, ExprPtr b, int line) {
    return std::make_unique<BinaryExpr>(ExprKind::Binary, op, std::move(a), std::move(b), line);
  }

  ExprPtr parse_math1() {
    int line = cur().line;
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      BinOp op = next().value == "+" ? BinOp::Add : BinOp::Sub;
      left = binary(op, std::move(left), parse_concat(), line);
      line = cur().line;
    }
    return left;
  }

  ExprPtr parse_concat() {
    int line = cur().line;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto c = std::make_unique<ConcatExpr>(line);
    c->items.push_back(std::move(first));
    while (skip_op("~")) c->items.push_back(parse_math2());
    return c;
  }

  ExprPtr parse_math2() {
    int line = cur().line;
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string o = next().value;
      BinOp op = o == "*" ? BinOp::Mul : o == "/" ? BinOp::Div : o == "//" ? BinOp::FloorDiv : BinOp::Mod;
      left = binary(op, std::move(left), parse_pow(), line);
      line = cur().line;
    }
    return left;
  }

  ExprPtr parse_pow() {
    int line = cur().line;
    ExprPtr left = parse_unary(true);
    while (skip_op("**")) {
      left = binary(BinOp::Pow, std::move(left), parse_unary(true), line);
      line = cur().line;
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(this);
    int line = cur().line;
    ExprPtr node;
    if (skip_op("-")) {
      node = std::make_unique<UnaryExpr>(ExprKind::Neg, parse_unary(false), line);
    } else if (skip_op("+")) {
      node = std::make_unique<UnaryExpr>(ExprKind::Pos, parse_unary(false), line);
    } else {
      node = parse_primary(false);
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary(bool with_namespace) {
    DepthGuard guard(this);
    const Token& tok = cur();
    int line = tok.line;
    if (tok.type == TokenType::Name) {
      std::string v = tok.value;
      next();
      if (v == "true" || v == "True") return std::make_unique<ConstExpr>(Value(true), line);
      if (v == "false" || v == "False") return std::make_unique<ConstExpr>(Value(false), line);
      if (v == "none" || v == "None") return std::make_unique<ConstExpr>(Value::none(), line);
      if (with_namespace && is_op(".")) {
        next();
        std::string attr = expect_type(TokenType::Name).value;
        return std::make_unique<NSRefExpr>(v, attr, line);
      }
      if (v == "varargs" || v == "kwargs" || v == "caller")
        for (MacroDef* m : macro_stack_) {
          if (v == "varargs") m->uses_varargs = true;
          if (v == "kwargs") m->uses_kwargs = true;
          if (v == "caller") m->uses_caller = true;
        }
      return std::make_unique<NameExpr>(v, line);
    }
    if (tok.type == TokenType::String) {
      std::string s;
      while (cur().type == TokenType::String) s += next().value;
      return std::make_unique<ConstExpr>(Value(std::move(s)), line);
    }
    if (tok.type == TokenType::Integer) return std::make_unique<ConstExpr>(Value(next().int_value), line);
    if (tok.type == TokenType::Float) return std::make_unique<ConstExpr>(Value(next().float_value), line);
    if (is_op("(")) {
      next();
      ExprPtr e = parse_tuple(false, true, {}, true);
      expect_op(")");
      return e;
    }
    if (is_op("[")) return parse_list();
    if (is_op("{")) return parse_dict();
    if (tok.type == TokenType::Eof) fail("unexpected end of template");
    fail("unexpected '" + describe_current() + "'");
  }

  bool is_tuple_end(std::initializer_list<std::string_view> extra_end) const {
    TokenType t = cur().type;
    if (t == TokenType::VariableEnd || t == TokenType::BlockEnd || is_op(")")) return true;
    return at_end_tag(extra_end);
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, std::initializer_list<std::string_view> extra_end,
                      bool explicit_parens, bool with_namespace = false) {
    int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(simplified ? parse_primary(with_namespace) : parse_expression(with_condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
      line = cur().line;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) fail("Expected an expression, got '" + describe_current() + "'");
    }
    auto t = std::make_unique<SeqExpr>(ExprKind::Tuple, line);
    t->items = std::move(args);
    return t;
  }

  ExprPtr parse_list() {
    auto l = std::make_unique<SeqExpr>(ExprKind::List, next().line);
    while (!is_op("]")) {
      if (!l->items.empty()) expect_op(",");
      if (is_op("]")) break;
      l->items.push_back(parse_expression(true));
    }
    expect_op("]");
    return l;
  }

  ExprPtr parse_dict() {
    auto d = std::make_unique<DictExpr>(next().line);
    while (!is_op("}")) {
      if (!d->pairs.empty()) expect_op(",");
      if (is_op("}")) break;
      ExprPtr key = parse_expression(true);
      expect_op(":");
      ExprPtr value = parse_expression(true);
      d->pairs.emplace_back(std::move(key), std::move(value));
    }
    expect_op("}");
    return d;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    DepthGuard guard(this);
    const Token& tok = next();
    int line = tok.line;
    if (tok.value == ".") {
      const Token& attr = next();
      if (attr.type == TokenType::Name) return std::make_unique<GetattrExpr>(std::move(node), attr.value, line);
      if (attr.type != TokenType::Integer) fail("expected name or number", attr.line);
      return std::make_unique<GetitemExpr>(std::move(node), std::make_unique<ConstExpr>(Value(attr.int_value), attr.line),
                                           line);
    }
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    ExprPtr index;
    if (args.size() == 1) {
      index = std::move(args[0]);
    } else {
      auto t = std::make_unique<SeqExpr>(ExprKind::Tuple, line);
      t->items = std::move(args);
      index = std::move(t);
    }
    return std::make_unique<GetitemExpr>(std::move(node), std::move(index), line);
  }

  ExprPtr parse_subscribed() {
    int line = cur().line;
    auto slice = std::make_unique<SliceExpr>(line);
    if (is_op(":")) {
      next();
    } else {
      ExprPtr e = parse_expression(true);
      if (!is_op(":")) return e;
      next();
      slice->start = std::move(e);
    }
    if (!is_op(":") && !is_op("]") && !is_op(",")) slice->stop = parse_expression(true);
    if (skip_op(":")) {
      if (!is_op("]") && !is_op(",")) slice->step = parse_expression(true);
    }
    return slice;
  }

  ArgList parse_call_args() {
    int line = cur().line;
    expect_op("(");
    ArgList a;
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) fail("invalid syntax for function call expression", line);
    };
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*")) {
        ensure(!a.dyn_args && !a.dyn_kwargs);
        next();
        a.dyn_args = parse_expression(true);
      } else if (is_op("**")) {
        ensure(!a.dyn_kwargs);
        next();
        a.dyn_kwargs = parse_expression(true);
      } else if (cur().type == TokenType::Name && look().type == TokenType::Operator && look().value == "=") {
        ensure(!a.dyn_kwargs);
        std::string key = next().value;
        next();
        a.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        ensure(!a.dyn_args && !a.dyn_kwargs && a.kwargs.empty());
        a.args.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
    return a;
  }

  ExprPtr parse_call(ExprPtr node) {
    DepthGuard guard(this);
    auto c = std::make_unique<CallExpr>(cur().line);
    c->args = parse_call_args();
    c->callee = std::move(node);
    return c;
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op("|") || start_inline) {
      DepthGuard guard(this);
      if (!start_inline) next();
      const Token& tok = expect_type(TokenType::Name);
      auto f = std::make_unique<FilterExpr>(tok.line);
      f->name = tok.value;
      while (skip_op(".")) f->name += "." + expect_type(TokenType::Name).value;
      if (is_op("(")) f->args = parse_call_args();
      f->fn = find_filter(f->name);
      if (!f->fn && !soft_) fail("No filter named '" + f->name + "'.", f->line);
      f->node = std::move(node);
      node = std::move(f);
      start_inline = false;
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    DepthGuard guard(this);
    int line = next().line;
    bool negated = skip_name("not");
    auto t = std::make_unique<TestExpr>(line);
    t->name = expect_type(TokenType::Name).value;
    while (skip_op(".")) t->name += "." + expect_type(TokenType::Name).value;
    TokenType ct = cur().type;
    if (is_op("(")) {
      t->args = parse_call_args();
    } else if ((ct == TokenType::Name || ct == TokenType::String || ct == TokenType::Integer ||
                ct == TokenType::Float || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("You cannot chain multiple tests with is");
      ExprPtr arg = parse_primary(false);
      t->args.args.push_back(parse_postfix(std::move(arg)));
    }
    t->fn = find_test(t->name);
    if (!t->fn && !soft_) fail("No test named '" + t->name + "'.", line);
    t->node = std::move(node);
    if (negated) return std::make_unique<UnaryExpr>(ExprKind::Not, std::move(t), line);
    return t;
  }

  std::vector<Token> t_;
  size_t pos_ = 0;
  ParseOptions opt_;
  int depth_ = 0;
  int loop_depth_ = 0;
  bool soft_ = false;
  std::vector<std::string> tag_stack_;
  std::vector<MacroDef*> macro_stack_;
};

}  // namespace

Result<TemplateAst> parse_template(std::string_view source, const ParseOptions& options) {
  LexerOptions lo;
  lo.trim_blocks = options.trim_blocks;
  lo.lstrip_blocks = options.lstrip_blocks;
  auto tokens = tokenize(source, lo);
  if (!tokens.ok()) return tokens.error();
  Parser parser(std::move(tokens).value(), options);
  try {
    return parser.run();
  } catch (const ParseError& e) {
    return make_error("line " + std::to_string(e.line) + ": " + e.message);
  }
}

}  // namespace muse::jinja
