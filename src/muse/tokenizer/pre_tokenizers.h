// tokenizer.json pre-tokenizers. A pre-tokenizer cuts one piece of text
// into words and hands each to a sink, in order and without materialising
// lists; a Sequence chains its steps through nested sinks. `at_start` says
// whether a piece begins at offset 0 of the original input (Metaspace's
// prepend_scheme "first" needs it).
#pragma once

#include <memory>
#include <string_view>
#include <type_traits>
#include <utility>

#include "muse/core/json.h"
#include "muse/core/status.h"

namespace muse::tok {

// A non-owning reference to a callable (the callable must outlive it).
template <class Sig>
class FunctionRef;
template <class R, class... A>
class FunctionRef<R(A...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // NOLINT: implicit by design
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, A... a) -> R { return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<A>(a)...); }) {}
  R operator()(A... a) const { return call_(obj_, std::forward<A>(a)...); }

 private:
  void* obj_;
  R (*call_)(void*, A...);
};

using WordSink = FunctionRef<void(std::string_view word, bool at_start)>;

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void pre_tokenize(std::string_view text, bool at_start, WordSink sink) const = 0;
};

// Whether the pre-tokenizer's last step is ByteLevel (alone or last in a
// Sequence): then the BPE model may take raw bytes (byte mode).
bool ends_with_byte_level(const Json& j);

// nullptr for JSON null. With `byte_mode`, a final ByteLevel step passes raw
// bytes through instead of mapping them to its alphabet.
Result<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const Json& j, bool byte_mode);

}  // namespace muse::tok
