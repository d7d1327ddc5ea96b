# muse-tiny (models/muse-tiny): the chat template against the Muse Glimmer conformance data
# (31 cases byte-identical, plus random conversations compared with the publisher's template;
# skips with 77 without ../shared or jinja2) and the shipped files' consistency (names,
# shapes, dtypes, token ids, size). Pure Python; seconds.
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  add_test(NAME tiny_chat_template
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/scripts/tiny/check_template.py --differential 500
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(tiny_chat_template PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120)
  add_test(NAME tiny_model_files
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/scripts/tiny/check_model_files.py
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(tiny_model_files PROPERTIES TIMEOUT 60)
  # The training-data generator: 300 conversations, each target turn's prompt checked against
  # the generation-prompt render (needs jinja2 only).
  add_test(NAME tiny_gen_data
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/scripts/tiny/gen_data.py --count 300 --workers 1
                   --check --out ${CMAKE_CURRENT_BINARY_DIR}/tiny_gen_data.jsonl
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(tiny_gen_data PROPERTIES TIMEOUT 60)
else()
  message(STATUS "muse: python3 not found; the muse-tiny file checks are not registered")
endif()

# The seed-000 quality gates through `muse serve` (real engine, CPU, no MODEL
# argument: the embedded model) and the official `openai` npm client; the npm
# packages come from tests/server/js (skips with 77 without node/npm).
add_test(NAME tiny_gates
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/server/js/run.sh $<TARGET_FILE:muse>
                 ${CMAKE_CURRENT_SOURCE_DIR}/tests/tiny/gates.test.mjs
         WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(tiny_gates PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS "node"
                     FIXTURES_REQUIRED server_js_npm)  # tests/server/tests.cmake
# The gates again with speculative decoding on (MUSE_SPEC_SERVE_EXTRA: tests/server/tests.cmake).
add_test(NAME tiny_gates_spec
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/server/js/run.sh $<TARGET_FILE:muse>
                 ${CMAKE_CURRENT_SOURCE_DIR}/tests/tiny/gates.test.mjs
         WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(tiny_gates_spec PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS "node"
                     FIXTURES_REQUIRED server_js_npm ENVIRONMENT "MUSE_SERVE_EXTRA=${MUSE_SPEC_SERVE_EXTRA}")
