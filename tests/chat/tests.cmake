# Extra chat tests: the renderer used by the differential Jinja checks, and
# the @huggingface/jinja and Python jinja2 conformance runs.
add_executable(chat_jinja_render ${CMAKE_CURRENT_SOURCE_DIR}/tests/chat/tools/jinja_render_cases.cc)
target_link_libraries(chat_jinja_render PRIVATE muse_chat)
