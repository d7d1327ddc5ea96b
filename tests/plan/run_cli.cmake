# Runs `muse plan` and checks its exit status and output.
#   cmake -DMUSE=<muse binary> -DARGS="plan;--model;..." -DEXPECT_RC=<n>
#         -DEXPECT="<regex>;<regex>..." -P run_cli.cmake
# Every regex must match the combined stdout and stderr.
execute_process(COMMAND ${MUSE} ${ARGS}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
set(all "${out}${err}")
if(NOT rc STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "muse ${ARGS}: exit status ${rc}, expected ${EXPECT_RC}\n${all}")
endif()
foreach(re IN LISTS EXPECT)
  if(NOT all MATCHES "${re}")
    message(FATAL_ERROR "muse ${ARGS}: output does not match '${re}'\n${all}")
  endif()
endforeach()
