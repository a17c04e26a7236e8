# install.cmake - make install's step for the Python client: pip installs clients/python into the
# platform's site-packages under the install prefix (and $DESTDIR), with its .dist-info, so
# that `pip uninstall oversub` removes it again. Offline: the build backend is in the tree.
#
# CMakeLists.txt runs it with install(CODE); by hand:
#   DESTDIR=/tmp/stage cmake -DOSUB_PYTHON=/usr/bin/python3 -DOSUB_PY_SOURCE=clients/python \
#       -DCMAKE_INSTALL_PREFIX=/usr/local -P clients/python/install.cmake
#
# No python3, or no pip for it (Debian: python3-pip): a warning, and the rest of the install
# goes on; `pip install clients/python` does the same later.
if(NOT OSUB_PY_SOURCE)
  get_filename_component(OSUB_PY_SOURCE "${CMAKE_CURRENT_LIST_DIR}" ABSOLUTE)
endif()
if(NOT OSUB_PYTHON)
  find_program(OSUB_PYTHON NAMES python3 HINTS /usr/bin)
endif()
if(NOT OSUB_PYTHON)
  message(WARNING "oversub: no python3 found: the Python client (clients/python) is not installed")
  return()
endif()
execute_process(COMMAND "${OSUB_PYTHON}" -m pip --version RESULT_VARIABLE _osub_pip
                OUTPUT_QUIET ERROR_QUIET)
if(NOT _osub_pip EQUAL 0)
  message(WARNING "oversub: ${OSUB_PYTHON} has no pip (Debian: python3-pip): the Python client "
                  "is not installed; later: ${OSUB_PYTHON} -m pip install ${OSUB_PY_SOURCE}")
  return()
endif()
# The folder the platform's python3 reads packages from under the prefix. Debian's python puts
# packages under /usr/local in .../dist-packages (its posix_local scheme), its own under /usr in
# /usr/lib/python3/dist-packages (deb_system); elsewhere, and for other prefixes, the standard
# PREFIX/lib/pythonX.Y/site-packages. (pip's own --prefix gets Debian wrong: /usr/local/local.)
execute_process(
  COMMAND "${OSUB_PYTHON}" -c "import sys, sysconfig
p = sys.argv[1].rstrip('/') or '/'
s = sysconfig.get_scheme_names()
if p == '/usr' and 'deb_system' in s:
    print(sysconfig.get_path('purelib', 'deb_system'))
elif p == '/usr/local' and 'posix_local' in s:
    print(sysconfig.get_path('purelib', 'posix_local'))
else:
    print(sysconfig.get_path('purelib', 'posix_prefix', vars={'base': p, 'platbase': p}))
" "${CMAKE_INSTALL_PREFIX}"
  RESULT_VARIABLE _osub_rc OUTPUT_VARIABLE _osub_site OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _osub_rc EQUAL 0 OR _osub_site STREQUAL "")
  message(FATAL_ERROR "oversub: ${OSUB_PYTHON} could not name its site-packages folder")
endif()
set(_osub_target "$ENV{DESTDIR}${_osub_site}")
message(STATUS "Installing: ${_osub_target}/oversub (the Python client, with pip)")
execute_process(
  COMMAND "${OSUB_PYTHON}" -m pip install --no-index --no-deps --no-build-isolation --upgrade
          --disable-pip-version-check --no-warn-script-location --target "${_osub_target}"
          "${OSUB_PY_SOURCE}"
  RESULT_VARIABLE _osub_rc OUTPUT_VARIABLE _osub_out ERROR_VARIABLE _osub_err)
if(NOT _osub_rc EQUAL 0)
  message(FATAL_ERROR "oversub: pip could not install the Python client:\n${_osub_out}${_osub_err}")
endif()
