#!/usr/bin/env bash
# `muse tokenize` / `muse detokenize` end to end on a small model directory
# (tests/tokenizer/data/tiny_tokenizer.json: byte-level BPE with merges for
# "the" and " cat", <|begin_of_text|> = 261 added by the post-processor,
# <|eot|> = 262).
#   cli_test.sh MUSE_BINARY TINY_TOKENIZER_JSON
set -u
muse=$1
fixture=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp "$fixture" "$dir/tokenizer.json"
printf '{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot|>", "add_bos_token": false}\n' > "$dir/tokenizer_config.json"

passed=0
failed=0
expect() {  # expect NAME WANT GOT
  if [ "$2" == "$3" ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL $1: want [$2] got [$3]"; fi
}
expect_error() {  # expect_error NAME SUBSTRING command...
  local name=$1 want=$2
  shift 2
  local out
  out=$("$@" 2>&1 >/dev/null)
  local rc=$?
  if [ $rc -ne 0 ] && [[ "$out" == *"$want"* ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL $name: rc=$rc stderr [$out]"; fi
}

expect ids "257 260 262" "$("$muse" tokenize --model "$dir" --text 'the cat<|eot|>')"
expect json '{"ids": [257, 260, 262]}' "$("$muse" tokenize --model "$dir" --text 'the cat<|eot|>' --json)"
expect add_special "261 257 260" "$("$muse" tokenize --model "$dir" --text 'the cat' --add-special-tokens)"
expect tokenizer_file "257 260" "$("$muse" tokenize --tokenizer "$dir/tokenizer.json" --text 'the cat')"
expect show_tokens "$(printf '257\t"the"\n260\t"\\u0120cat"')" "$("$muse" tokenize --model "$dir" --text 'the cat' --show-tokens | sed 's/Ġ/\\u0120/')"
printf 'the cat' > "$dir/input.txt"
expect file "257 260" "$("$muse" tokenize --model "$dir" --file "$dir/input.txt")"
expect stdin "257 260" "$(printf 'the cat' | "$muse" tokenize --model "$dir" --file -)"
expect empty "" "$("$muse" tokenize --model "$dir" --text '')"
expect detokenize "the cat<|eot|>" "$("$muse" detokenize --model "$dir" --ids '257 260 262')"
expect detokenize_skip "the cat" "$("$muse" detokenize --model "$dir" --ids '[257, 260, 262]' --skip-special-tokens)"
expect detokenize_json '{"text": "the cat"}' "$("$muse" detokenize --model "$dir" --ids 257,260 --json)"

expect_error no_dir "model directory not found" "$muse" tokenize --model "$dir/nope" --text x
mkdir "$dir/empty"
expect_error no_tokenizer_json "has no tokenizer.json" "$muse" tokenize --model "$dir/empty" --text x
expect_error no_text "exactly one of --text" "$muse" tokenize --model "$dir"
expect_error both_sources "either --model or --tokenizer" "$muse" tokenize --model "$dir" --tokenizer "$dir/tokenizer.json" --text x
printf '{"model": ' > "$dir/empty/tokenizer.json"
expect_error bad_json "not valid JSON" "$muse" tokenize --model "$dir/empty" --text x
printf '{"bos_token": [1]}' > "$dir/tokenizer_config.json"
expect_error bad_config "bos_token" "$muse" tokenize --model "$dir" --text x
expect_error bad_ids "is not a token id" "$muse" detokenize --tokenizer "$dir/tokenizer.json" --ids "1 x"
expect_error unknown_flag "--bogus" "$muse" tokenize --model "$dir" --text x --bogus

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
