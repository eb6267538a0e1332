#!/bin/sh
# dev/gpu_sources_hash.sh: a hash of the sources the GPU binaries are built from. `make gpu_binaries` writes
# it to build/gpu/SOURCES; dev/gpu_check.sh uses those binaries only if it matches the sources it runs with.
# The file list is sorted in the C locale, so the hash does not depend on the machine's locale.
cd "$(dirname "$0")/.." || exit 1
LC_ALL=C find Makefile *.cu *.cuh *.cpp llmc chat dev/cuda dev/bench dev/gpu dev/test/check.h -maxdepth 1 -type f \
    \( -name Makefile -o -name '*.cu' -o -name '*.cuh' -o -name '*.h' -o -name '*.cpp' \) | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16
