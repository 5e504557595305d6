# cmake -DSOURCES=<list> -DOUT=<header> -P source_hash.cmake: writes a header defining
# KILN_CODEGEN_SOURCE_HASH, a hash of the sources that decide the generated code. It is part of
# the compile cache's version, so editing the pipeline invalidates old entries by itself.
set(all "")
foreach(f IN LISTS SOURCES)
  file(SHA256 "${f}" h)
  string(APPEND all "${h}")
endforeach()
string(SHA256 digest "${all}")
string(SUBSTRING "${digest}" 0 16 digest)
file(WRITE "${OUT}.tmp" "#define KILN_CODEGEN_SOURCE_HASH \"${digest}\"\n")
# Only a changed hash rewrites the header (and recompiles cache.cpp).
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
