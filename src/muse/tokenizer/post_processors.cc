#include "muse/tokenizer/post_processors.h"

#include <string>

namespace muse::tok {
namespace {

class NoOpProcessor final : public PostProcessor {
 public:
  void process(std::vector<int32_t>&) const override {}
};

// The "single" template: a list of special-token id lists and the sequence.
class TemplateProcessor final : public PostProcessor {
 public:
  struct Piece {
    bool is_sequence;
    std::vector<int32_t> ids;
  };
  explicit TemplateProcessor(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}
  void process(std::vector<int32_t>& ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 8);
    for (const Piece& p : pieces_) {
      if (p.is_sequence) out.insert(out.end(), ids.begin(), ids.end());
      else out.insert(out.end(), p.ids.begin(), p.ids.end());
    }
    ids.swap(out);
  }

 private:
  std::vector<Piece> pieces_;
};

class WrapProcessor final : public PostProcessor {  // RoBERTa / BERT
 public:
  WrapProcessor(int32_t cls, int32_t sep) : cls_(cls), sep_(sep) {}
  void process(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), cls_);
    ids.push_back(sep_);
  }

 private:
  int32_t cls_, sep_;
};

class SequenceProcessor final : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> steps) : steps_(std::move(steps)) {}
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& s : steps_) s->process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

Result<int32_t> token_pair_id(const Json& j, const char* key, const std::string& where) {
  const Json* p = j.find(key);
  if (!p || !p->is_array() || p->size() != 2 || !p->as_array()[1].is_int())
    return make_error(where + "." + key + " must be [token, id]");
  return int32_t(p->as_array()[1].as_int());
}

Result<std::unique_ptr<PostProcessor>> make_template(const Json& j) {
  const Json* single = j.find("single");
  if (!single || !single->is_array())
    return make_error("post_processor TemplateProcessing needs a 'single' list of pieces");
  const Json* specials = j.find("special_tokens");
  std::vector<TemplateProcessor::Piece> pieces;
  for (const Json& piece : single->as_array()) {
    if (piece.find("Sequence")) {
      pieces.push_back({true, {}});
      continue;
    }
    const Json* st = piece.find("SpecialToken");
    if (!st || !st->is_object())
      return make_error("post_processor TemplateProcessing: each piece must be Sequence or SpecialToken");
    std::string name = st->get_string("id", "");
    const Json* entry = specials ? specials->find(name) : nullptr;
    const Json* ids = entry ? entry->find("ids") : nullptr;
    if (!ids || !ids->is_array())
      return make_error("post_processor TemplateProcessing: special token '" + name + "' is missing from special_tokens");
    TemplateProcessor::Piece p{false, {}};
    for (const Json& id : ids->as_array()) {
      if (!id.is_int()) return make_error("post_processor TemplateProcessing: ids of '" + name + "' must be integers");
      p.ids.push_back(int32_t(id.as_int()));
    }
    pieces.push_back(std::move(p));
  }
  return std::unique_ptr<PostProcessor>(new TemplateProcessor(std::move(pieces)));
}

}  // namespace

Result<std::unique_ptr<PostProcessor>> make_post_processor(const Json& j) {
  using P = std::unique_ptr<PostProcessor>;
  if (j.is_null()) return P();
  if (!j.is_object()) return make_error("post_processor must be an object or null");
  std::string type = j.get_string("type", "");
  if (type == "ByteLevel") return P(new NoOpProcessor);
  if (type == "TemplateProcessing") return make_template(j);
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    std::string where = "post_processor " + type;
    MUSE_ASSIGN_OR_RETURN(int32_t cls, token_pair_id(j, "cls", where));
    MUSE_ASSIGN_OR_RETURN(int32_t sep, token_pair_id(j, "sep", where));
    return P(new WrapProcessor(cls, sep));
  }
  if (type == "Sequence") {
    const Json* list = j.find("processors");
    if (!list || !list->is_array()) return make_error("post_processor Sequence needs a 'processors' array");
    std::vector<P> steps;
    for (const Json& s : list->as_array()) {
      MUSE_ASSIGN_OR_RETURN(P step, make_post_processor(s));
      if (step) steps.push_back(std::move(step));
    }
    return P(new SequenceProcessor(std::move(steps)));
  }
  if (type.empty()) return make_error("post_processor has no 'type'");
  return make_error("unsupported post_processor type '" + type +
                    "' (supported: TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence)");
}

}  // namespace muse::tok
