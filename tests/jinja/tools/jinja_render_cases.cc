// Renders template/context cases with muse's Jinja engine, for the
// differential tests against Python jinja2 (tests/jinja/py/hf_jinja.py) and
// @huggingface/jinja (tests/jinja/js/). Same line protocol as hf_jinja.py:
// stdin lines {"template", "context", "now"?: "YYYY-MM-DD"}; stdout lines
// {"ok": true, "text"} or {"ok": false, "error"}.
#include <ctime>
#include <iostream>
#include <string>

#include "muse/jinja/jinja.h"

int main() {
  std::ios::sync_with_stdio(false);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    muse::Json out = muse::Json::object();
    auto c = muse::Json::parse(line);
    if (!c.ok()) {
      out.set("ok", false);
      out.set("error", "bad case line: " + c.message());
    } else {
      const muse::Json* tpl = c->find("template");
      const muse::Json* ctx = c->find("context");
      muse::jinja::RenderOptions opts;
      std::string now = c->get_string("now", "");
      if (now.size() == 10) {
        std::tm tm{};
        tm.tm_year = std::stoi(now.substr(0, 4)) - 1900;
        tm.tm_mon = std::stoi(now.substr(5, 2)) - 1;
        tm.tm_mday = std::stoi(now.substr(8, 2));
        opts.now_unix_seconds = int64_t(timegm(&tm));
      }
      auto t = muse::jinja::Template::parse(tpl && tpl->is_string() ? tpl->as_string() : "");
      if (!t.ok()) {
        out.set("ok", false);
        out.set("error", t.message());
      } else {
        auto r = t->render(ctx ? *ctx : muse::Json::object(), opts);
        out.set("ok", r.ok());
        if (r.ok()) out.set("text", *r);
        else out.set("error", r.message());
      }
    }
    std::cout << out.dump() << "\n" << std::flush;
  }
  return 0;
}
