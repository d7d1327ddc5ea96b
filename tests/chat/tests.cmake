# `muse render` end to end on the 31 Muse Glimmer cases (skips without the
# shared data or a reference tokenizer.json). The Jinja engine's own
# conformance runs are in tests/jinja/tests.cmake.
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  add_test(NAME chat_render_cli
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/py/check_render_cli.py $<TARGET_FILE:muse>
                   ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_BINARY_DIR}
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(chat_render_cli PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS "conformance")
endif()
