# Extra chat tests: the renderer used by the differential Jinja checks, and
# the @huggingface/jinja and Python jinja2 conformance runs.
add_executable(chat_jinja_render ${CMAKE_CURRENT_SOURCE_DIR}/tests/chat/tools/jinja_render_cases.cc)
target_link_libraries(chat_jinja_render PRIVATE muse_chat)

# Every chat template x conversation against @huggingface/jinja (and Python
# jinja2 when installed, which is the truth). Skips (77) without npm/registry.
find_program(MUSE_NODE node)
if(MUSE_NODE)
  add_test(NAME chat_jinja_conformance
           COMMAND ${MUSE_NODE} ${CMAKE_CURRENT_LIST_DIR}/js/conformance.mjs $<TARGET_FILE:chat_jinja_render>
                   ${CMAKE_CURRENT_SOURCE_DIR}
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(chat_jinja_conformance PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900 LABELS "conformance")
else()
  message(STATUS "muse: node not found; the chat template conformance test is not registered")
endif()

# The snippet fixture regenerated live from Python jinja2, when installed
# (python3-jinja2): catches drift between the committed fixture and jinja2.
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  add_test(NAME chat_jinja_python
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/py/check_live.py $<TARGET_FILE:chat_jinja_render>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(chat_jinja_python PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS "conformance")
endif()

# `muse render` end to end on the 31 Muse Glimmer cases (skips without the
# shared data or a reference tokenizer.json).
if(Python3_Interpreter_FOUND)
  add_test(NAME chat_render_cli
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/py/check_render_cli.py $<TARGET_FILE:muse>
                   ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_BINARY_DIR}
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(chat_render_cli PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS "conformance")
endif()
