# The npm packages of tests/server/js, installed once before the tests that
# use them (server_clients_js*, tiny_gates), so that ctest -j never runs two
# installs into the same node_modules.
add_test(NAME server_js_npm_install COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/server/js/install.sh)
set_tests_properties(server_js_npm_install PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS "node"
                     FIXTURES_SETUP server_js_npm)

# Client-library tests: the official `openai` and `@anthropic-ai/sdk` npm
# packages against `muse_fake serve` on a free loopback port.
add_test(NAME server_clients_js
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/server/js/run.sh $<TARGET_FILE:muse_fake>
         WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(server_clients_js PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS "node"
                     FIXTURES_REQUIRED server_js_npm)
# The same clients against the real engine on models/muse-tiny (~10 s).
add_test(NAME server_clients_js_real
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/server/js/run.sh $<TARGET_FILE:muse>
                 ${CMAKE_CURRENT_SOURCE_DIR}/tests/server/js/real_engine.test.mjs
         WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(server_clients_js_real PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS "node"
                     FIXTURES_REQUIRED server_js_npm)
# Again with speculative decoding on (muse-tiny's DSpark drafter, 3 drafts).
set(MUSE_SPEC_SERVE_EXTRA [=[["--speculative-config","{\"method\":\"dspark\",\"model\":\"@DRAFTER@\",\"num_speculative_tokens\":3}"]]=])
string(REPLACE "@DRAFTER@" "${CMAKE_CURRENT_SOURCE_DIR}/models/muse-tiny/drafter" MUSE_SPEC_SERVE_EXTRA "${MUSE_SPEC_SERVE_EXTRA}")
add_test(NAME server_clients_js_real_spec
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/server/js/run.sh $<TARGET_FILE:muse>
                 ${CMAKE_CURRENT_SOURCE_DIR}/tests/server/js/real_engine.test.mjs
         WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(server_clients_js_real_spec PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS "node"
                     FIXTURES_REQUIRED server_js_npm ENVIRONMENT "MUSE_SERVE_EXTRA=${MUSE_SPEC_SERVE_EXTRA}")

# Load test: 256 concurrent streams, random client disconnects, then the
# server must still answer (run under -DMUSE_SANITIZE=address,undefined too).
add_executable(server_load_test ${CMAKE_CURRENT_SOURCE_DIR}/tests/server/load/load_test.cc)
target_link_libraries(server_load_test PRIVATE muse_all)
add_test(NAME server_load COMMAND server_load_test --muse $<TARGET_FILE:muse_fake> --clients 256)
set_tests_properties(server_load PROPERTIES TIMEOUT 300 LABELS "load")

# Every vllm flag of the shared/seeds recipes is recognised (acts or is refused by name).
# (muse_fake parses exactly `muse serve`'s flags, and needs no model to start.)
add_test(NAME server_seed_flags COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/server/seed_flags.sh $<TARGET_FILE:muse_fake>)
set_tests_properties(server_seed_flags PROPERTIES TIMEOUT 120)

# The fake model (tests/support/fake_model/) for the in-process server tests.
target_link_libraries(test_server PRIVATE muse_fake_model)
# Issue 17: accept() at the descriptor limit backs off and logs once per
# interval; max_connections is capped by RLIMIT_NOFILE (~5 s).
add_executable(server_fd_limit_test ${CMAKE_CURRENT_SOURCE_DIR}/tests/server/load/fd_limit_test.cc)
target_link_libraries(server_fd_limit_test PRIVATE muse_all)
add_test(NAME server_fd_limit COMMAND server_fd_limit_test)
set_tests_properties(server_fd_limit PROPERTIES TIMEOUT 60)
