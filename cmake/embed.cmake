# embed.cmake - turns a file into a C array: cmake -DIN=FILE -DOUT=FILE.c -DNAME=sym -P embed.cmake
# (the dashboard page and the OpenAPI description are served from the binary: no files to
# install beside it, nothing to build in a browser's toolchain)
file(READ "${IN}" content HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${content}")
file(WRITE "${OUT}" "/* generated from ${IN} by cmake/embed.cmake: do not edit */\n#include <stddef.h>\nconst unsigned char ${NAME}[] = {${bytes} 0x00};\nconst size_t ${NAME}_len = sizeof(${NAME}) - 1;\n")
