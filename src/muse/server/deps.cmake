# Boost.Beast/Asio are header-only: only the headers are needed (no Boost
# libraries to link). Asio needs threads, which muse_flags already links.
find_package(Boost 1.74 REQUIRED)
target_link_libraries(${MUSE_TARGET} PUBLIC Boost::headers)
# Asio with io_uring/epoll defaults; no deprecated APIs.
target_compile_definitions(${MUSE_TARGET} PRIVATE BOOST_ASIO_NO_DEPRECATED BOOST_BEAST_USE_STD_STRING_VIEW)
