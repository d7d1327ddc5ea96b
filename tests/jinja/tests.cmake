# Extra Jinja tests: the renderer used by the differential checks, and the
# @huggingface/jinja and Python jinja2 conformance runs. test_jinja, the
# renderer and fuzz/fuzz_jinja.cc link the jinja library alone (with core).
if(TARGET test_jinja)
  set_property(TARGET test_jinja PROPERTY LINK_LIBRARIES muse_jinja GTest::gtest GTest::gtest_main)
endif()
add_executable(jinja_render ${CMAKE_CURRENT_SOURCE_DIR}/tests/jinja/tools/jinja_render_cases.cc)
target_link_libraries(jinja_render PRIVATE muse_jinja)

# Every chat template x conversation against @huggingface/jinja (and Python
# jinja2 when installed, which is the truth). Skips (77) without npm/registry.
find_program(MUSE_NODE node)
if(MUSE_NODE)
  add_test(NAME jinja_conformance
           COMMAND ${MUSE_NODE} ${CMAKE_CURRENT_LIST_DIR}/js/conformance.mjs $<TARGET_FILE:jinja_render>
                   ${CMAKE_CURRENT_SOURCE_DIR}
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(jinja_conformance PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900 LABELS "conformance" COST 30)
else()
  message(STATUS "muse: node not found; the Jinja conformance test is not registered")
endif()

# The snippet fixture regenerated live from Python jinja2, when installed
# (python3-jinja2): catches drift between the committed fixture and jinja2.
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  add_test(NAME jinja_python
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/py/check_live.py $<TARGET_FILE:jinja_render>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(jinja_python PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS "conformance")
endif()
