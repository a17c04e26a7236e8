# daemon_units.cmake - unit tests of oversubd's modules (issue 24), included by tests/CMakeLists.txt
# Each runs without a daemon process: the real core on a temporary state folder, or the modules
# above the core against the fake core (unit/fake_core.c). A test's own sources come before the
# osubd library on the link line, so fake_core.c's definitions of core.h keep core.o out.

function(osubd_module_test name)
  add_executable(${name} unit/${name}.c ${ARGN})
  target_link_libraries(${name} osubd PkgConfig::CMOCKA PkgConfig::EVENT)
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/tests/unit)
  set(tname ${name})
  if(TEST ${name}) # an integration test has that name (test_state): this one is its _unit
    set(tname ${name}_unit)
  endif()
  add_test(NAME ${tname} COMMAND ${name})
  set_tests_properties(${tname} PROPERTIES LABELS unit TIMEOUT 60)
endfunction()

# the real core: commands applied and logged, hooks, tickets, the writer, replay, the lock
osubd_module_test(test_core)
# the state around the store: lock, marker, service key, tokens, engine settings, replay
osubd_module_test(test_state)
# osubd_log: format, tags, the threshold before the arguments
osubd_module_test(test_log)
# the pool: simulated specs, "auto" without a driver, NVML through the fake libnvidia-ml
osubd_module_test(test_monitor unit/fake_core.c)
target_compile_definitions(test_monitor PRIVATE FAKE_NVML_LIB="$<TARGET_FILE:fake_nvml>")
add_dependencies(test_monitor fake_nvml)
# the routes module through the fake core (and the fake core itself)
osubd_module_test(test_routes_module unit/fake_core.c)
