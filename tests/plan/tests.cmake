# Data-driven runs of `muse plan` (issue 6): the seeds' arithmetic through the
# command line and JSON, and bad input -> clear error + non-zero exit.
set(_plan_cli ${CMAKE_CURRENT_LIST_DIR}/run_cli.cmake)
function(muse_plan_cli_test name rc args expect)
  add_test(NAME plan_cli_${name}
           COMMAND ${CMAKE_COMMAND} -DMUSE=$<TARGET_FILE:muse> "-DARGS=${args}" -DEXPECT_RC=${rc}
                   "-DEXPECT=${expect}" -P ${_plan_cli}
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(plan_cli_${name} PROPERTIES LABELS "cli" TIMEOUT 120)
endfunction()

# Seed 002 parameters and seed 004 KV vectors (one 1M-token sequence, BF16).
muse_plan_cli_test(seed002_seed004 0
  "plan;--model;muse-spark-open;--hardware;b300x4;--json"
  "\"experts\": 798863917056,;\"attention\": 13522436096,;\"latent\": 4160749568,;\"embeddings\": 3310354432,;\"values_per_token_all_full\": 126976,;\"bytes_per_token_all_full\": 253952,;\"bytes_per_token\": 65536,;\"sliding_bytes_per_sequence\": 385875968,;\"bytes_at_max_model_len\": 69105352704,;\"all_full_bytes_at_max_model_len\": 266287972352,")
# 128K: 31 GiB all-full -> 8.36 GiB hybrid.
muse_plan_cli_test(seed004_128k 0
  "plan;--model;muse-spark-open;--hardware;b300x4;--max-model-len;128K;--json"
  "\"all_full_bytes_at_max_model_len\": 33285996544,;\"bytes_at_max_model_len\": 8975810560,")
# Seed 000: one GB300, 310 GiB of NVFP4 experts offloaded; pinned peak exact
# and with power-of-two rounding (equal: every Muse expert tensor is 2^n bytes).
muse_plan_cli_test(seed000_gb300 0
  "plan;--model;muse-spark-open-nvfp4;--hardware;gb300;--cpu-offload-gb;310;--cpu-offload-params;experts;--max-model-len;131072;--max-num-seqs;4;--gpu-memory-utilization;0.92;--json"
  "\"exact\": 334470836224,;\"power_of_two\": 334470836224,;\"last_tensor\": \"layers.43.mlp.experts.w13_weight\";\"decode_ceiling_tokens_per_s\": 37\\.8;\"fits\": true")
# No hardware: the model alone (params and KV) is sized, exit 0.
muse_plan_cli_test(model_only 0
  "plan;--model;muse-spark-open;--json"
  "\"experts\": 798863917056,;\"bytes_per_token\": 65536,;\"decode_ceiling_tokens_per_s\": null")
# The table is the default output.
muse_plan_cli_test(table 0
  "plan;--model;muse-spark-open-nvfp4;--hardware;gb300;--max-model-len;128K"
  "Pinned host memory;power-of-two buffers;Decode ceiling;FITS")
muse_plan_cli_test(glimmer_config 0
  "plan;--model;${CMAKE_CURRENT_LIST_DIR}/../../../shared/testdata/muse-glimmer/config.json;--hardware;h200;--json"
  "\"family\": \"muse_glimmer\";\"bytes_per_token\": 13312,")
if(NOT EXISTS ${CMAKE_CURRENT_LIST_DIR}/../../../shared/testdata/muse-glimmer/config.json)
  set_tests_properties(plan_cli_glimmer_config PROPERTIES DISABLED TRUE)
endif()

# Bad input: exit 2 with a message naming the problem and the valid choices.
muse_plan_cli_test(unknown_model 2 "plan;--model;muse-sparkle;--hardware;gb300"
  "unknown model 'muse-sparkle';muse-spark-open-nvfp4")
muse_plan_cli_test(unknown_hardware 2 "plan;--model;muse-spark-open;--hardware;gb3000"
  "unknown hardware profile 'gb3000';gb300, b300x4, h200, h200x8, mi355xx8, m5-ultra-512, xeon-6980p")
muse_plan_cli_test(impossible_len 2 "plan;--model;muse-spark-open;--hardware;gb300;--max-model-len;2M"
  "--max-model-len = 2097152 is impossible")
muse_plan_cli_test(impossible_util 2 "plan;--model;muse-spark-open;--hardware;gb300;--gpu-memory-utilization;0"
  "--gpu-memory-utilization")
muse_plan_cli_test(impossible_gpus 2 "plan;--model;muse-spark-open;--hardware;gb300;--gpus;0"
  "--gpus = 0 is impossible")
muse_plan_cli_test(bad_length 2 "plan;--model;muse-spark-open;--hardware;gb300;--max-model-len;lots"
  "--max-model-len expects a positive whole number")
muse_plan_cli_test(missing_model 2 "plan;--hardware;gb300" "--model is required")
muse_plan_cli_test(missing_field 2 "plan;--model;${CMAKE_CURRENT_LIST_DIR}/data/missing_hidden_size.json;--hardware;h200"
  "missing required key text_config.hidden_size")
# Does not fit: exit 1, the plan still printed.
muse_plan_cli_test(cannot_fit 1 "plan;--model;muse-spark-open;--hardware;h200"
  "cannot fit even with offload;DOES NOT FIT")
muse_plan_cli_test(unified_no_offload 1 "plan;--model;muse-spark-open-nvfp4;--hardware;m5-ultra-512"
  "no separate host memory")

# `muse bench --skip-ops` (the timing probe): names checked before anything
# is loaded, the step's inputs never skippable, CUDA only. (The same runner:
# exit status and output.)
muse_plan_cli_test(bench_skip_ops_unknown 2 "bench;--device;cuda;--skip-ops;swiglu,sigmoid"
  "--skip-ops: \"sigmoid\" is not an op that may be skipped;residual_norm, rms_norm")
muse_plan_cli_test(bench_skip_ops_set_input 2 "bench;--device;cuda;--skip-ops;set_input"
  "\"set_input\" is not an op that may be skipped")
muse_plan_cli_test(bench_skip_ops_cpu 2 "bench;--skip-ops;swiglu" "--skip-ops needs --device cuda")
muse_plan_cli_test(bench_enforce_eager_cpu 2 "bench;--enforce-eager" "--enforce-eager needs --device cuda")
muse_plan_cli_test(bench_one_stream_cpu 2 "bench;--one-stream" "--one-stream needs --device cuda")
