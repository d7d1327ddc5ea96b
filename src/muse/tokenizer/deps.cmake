# Oniguruma (the regex engine of Hugging Face tokenizers' Rust crate, so the
# pre-tokenizer patterns mean exactly what they mean there) and ICU (Unicode
# normalization and case mapping). See docs/tokenizer.md.
find_package(PkgConfig REQUIRED)
pkg_check_modules(MUSE_ONIG REQUIRED IMPORTED_TARGET oniguruma)
pkg_check_modules(MUSE_ICU REQUIRED IMPORTED_TARGET icu-uc)
get_target_property(muse_tokenizer_type ${MUSE_TARGET} TYPE)
if(muse_tokenizer_type STREQUAL "INTERFACE_LIBRARY")
  target_link_libraries(${MUSE_TARGET} INTERFACE PkgConfig::MUSE_ONIG PkgConfig::MUSE_ICU)
else()
  target_link_libraries(${MUSE_TARGET} PRIVATE PkgConfig::MUSE_ONIG PkgConfig::MUSE_ICU)
endif()
