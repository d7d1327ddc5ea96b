# Client-library tests: the official `openai` and `@anthropic-ai/sdk` npm
# packages against `muse serve --fake-model` on a free loopback port.
add_test(NAME server_clients_js
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/server/js/run.sh $<TARGET_FILE:muse>
         WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(server_clients_js PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS "node")
# The same clients against the real engine on models/muse-tiny (~10 s).
add_test(NAME server_clients_js_real
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/server/js/run.sh $<TARGET_FILE:muse>
                 ${CMAKE_CURRENT_SOURCE_DIR}/tests/server/js/real_engine.test.mjs
         WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(server_clients_js_real PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS "node")

# Load test: 256 concurrent streams, random client disconnects, then the
# server must still answer (run under -DMUSE_SANITIZE=address,undefined too).
add_executable(server_load_test ${CMAKE_CURRENT_SOURCE_DIR}/tests/server/load/load_test.cc)
target_link_libraries(server_load_test PRIVATE muse_all)
add_test(NAME server_load COMMAND server_load_test --muse $<TARGET_FILE:muse> --clients 256)
set_tests_properties(server_load PROPERTIES TIMEOUT 300 LABELS "load")

# Every vllm flag of the shared/seeds recipes is recognised (acts or is refused by name).
add_test(NAME server_seed_flags COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/server/seed_flags.sh $<TARGET_FILE:muse>)
set_tests_properties(server_seed_flags PROPERTIES TIMEOUT 120)

# Issue 17: accept() at the descriptor limit backs off and logs once per
# interval; max_connections is capped by RLIMIT_NOFILE (~5 s).
add_executable(server_fd_limit_test ${CMAKE_CURRENT_SOURCE_DIR}/tests/server/load/fd_limit_test.cc)
target_link_libraries(server_fd_limit_test PRIVATE muse_all)
add_test(NAME server_fd_limit COMMAND server_fd_limit_test)
set_tests_properties(server_fd_limit PROPERTIES TIMEOUT 60)
