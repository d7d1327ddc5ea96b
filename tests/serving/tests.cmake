# Serving: the engine loop behind the HTTP server on the embedded model.

# The serving benchmark (a program, run on demand; bench/NOTES.md "Serving").
add_executable(muse_serving_bench ${CMAKE_CURRENT_SOURCE_DIR}/bench/serving_bench.cc)
target_link_libraries(muse_serving_bench PRIVATE Threads::Threads)
# The multi-turn agent benchmark, with and without prefix caching (bench/NOTES.md).
add_executable(muse_agent_bench ${CMAKE_CURRENT_SOURCE_DIR}/bench/agent_bench.cc)
target_link_libraries(muse_agent_bench PRIVATE muse_all Threads::Threads)

# Load test on the real engine: 256 concurrent streams against models/muse-tiny,
# ~30% of the clients hanging up, a KV cache small enough that sequences are
# preempted and recomputed; every surviving greedy stream must equal the same
# request alone, the engine must end idle, the server must answer and exit 0.
add_test(NAME serving_load_real
         COMMAND server_load_test --muse $<TARGET_FILE:muse> --clients 256 --real --max-tokens 24
                 -- --max-num-seqs 64 --max-model-len 512 --kv-cache-memory-bytes 4M --block-size 16)
set_tests_properties(serving_load_real PROPERTIES TIMEOUT 600 LABELS "load" COST 70)  # starts first (COST)
# The same with a shared system prompt on every request: the prefix cache (on
# by default) shares its blocks across streams, hang-ups and preemptions.
add_test(NAME serving_load_real_shared_prefix
         COMMAND server_load_test --muse $<TARGET_FILE:muse> --clients 128 --real --max-tokens 24 --shared-system-prompt
                 -- --max-num-seqs 64 --max-model-len 512 --kv-cache-memory-bytes 8M --block-size 16)
set_tests_properties(serving_load_real_shared_prefix PROPERTIES TIMEOUT 600 LABELS "load")

# The real engine split over 2 CPU ranks (threads; muse-tiny is a Spark, so
# with expert parallelism): concurrent greedy streams equal each request alone.
add_test(NAME serving_load_real_tp2
         COMMAND server_load_test --muse $<TARGET_FILE:muse> --clients 24 --real --max-tokens 16
                 -- --tensor-parallel-size 2 --enable-expert-parallel --max-num-seqs 8 --max-model-len 512
                    --kv-cache-memory-bytes 8M --block-size 16)
set_tests_properties(serving_load_real_tp2 PROPERTIES TIMEOUT 300 LABELS "load")

# `muse run` with no model (the embedded one), --prompt/--raw/--json.
add_test(NAME serving_muse_run COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/serving/muse_run.sh $<TARGET_FILE:muse>)
set_tests_properties(serving_muse_run PROPERTIES TIMEOUT 120)
