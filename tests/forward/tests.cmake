# The forward tests also drive the `muse` binary (muse run --dump-logits on
# every fixture), so they need its path and must build after it.
if(TARGET test_forward)
  target_compile_definitions(test_forward PRIVATE MUSE_BINARY="$<TARGET_FILE:muse>")
  add_dependencies(test_forward muse)
endif()
