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
# the actuators through the fake core: load, the spec's actuation fields, what is shown, PIDs,
# directives after their commit (no program is run)
osubd_module_test(test_actuator unit/fake_core.c)
# the pods' evictions without an API server (kube_api none), through the real actuators
osubd_module_test(test_pods unit/fake_core.c)
# the gateway without a backend: listen on port 0, its health, no route, a client's share, drain,
# metrics, ambiguous framing (proxying is the integration test's)
osubd_module_test(test_gateway_unit unit/fake_core.c)
# the control API on loopback port 0 with the real actuators and routes: a loopback client in
# the test, replies held until the fake core's commit
osubd_module_test(test_api_unit unit/fake_core.c)
# the device plugin without a kubelet: the list's fit (pure), its allocations loaded from the
# meta or the old side file, saved, forgotten
osubd_module_test(test_dp_unit unit/fake_core.c)
# the settings' defaults and the admin token's file
osubd_module_test(test_config)

if(OSUB_CLANG)
  # the actuation fields of a submitted spec (src/daemon/act_take.c: osubd_exec_take, a pure
  # function of its rules) and the leaves it checks against: the destinations (netpolicy.c, with
  # sha256.c for its signatures) and Kubernetes names (src/k8s/pod.c)
  set(OSUB_FUZZ_EXEC_SRC src/daemon/act_take.c src/daemon/netpolicy.c src/daemon/sha256.c
                         src/k8s/pod.c src/daemon/suspender.c src/daemon/sus_cuda.c
                         src/daemon/httpc.c)
  list(TRANSFORM OSUB_FUZZ_EXEC_SRC PREPEND ${CMAKE_SOURCE_DIR}/)
  add_custom_command(
    OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/fuzz_exec
    COMMAND ${OSUB_CLANG} -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
            -I${CMAKE_SOURCE_DIR}/src/daemon -I${CMAKE_SOURCE_DIR}/include
            -I${CMAKE_SOURCE_DIR}/src/k8s -I${CMAKE_SOURCE_DIR}/src/shim ${OSUB_FUZZ_EXEC_SRC}
            ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_exec.c -ljansson -levent -lpthread -ldl
            -o ${CMAKE_CURRENT_BINARY_DIR}/fuzz_exec
    DEPENDS ${OSUB_FUZZ_EXEC_SRC} ${CMAKE_SOURCE_DIR}/src/daemon/act.h
            ${CMAKE_SOURCE_DIR}/src/daemon/actuator.h ${CMAKE_SOURCE_DIR}/src/daemon/netpolicy.h
            ${CMAKE_SOURCE_DIR}/src/k8s/pod.h ${CMAKE_SOURCE_DIR}/src/daemon/suspender.h
            ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_exec.c
    COMMENT "libFuzzer target fuzz_exec (clang)")
  add_custom_target(fuzz_exec_bin ALL DEPENDS ${CMAKE_CURRENT_BINARY_DIR}/fuzz_exec)
  add_test(NAME fuzz_exec COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/run_fuzz.sh exec
           ${CMAKE_CURRENT_BINARY_DIR}/fuzz_exec 10)
  set_tests_properties(fuzz_exec PROPERTIES LABELS fuzz TIMEOUT 120)
endif()
# the suspend mechanisms (issue 25): the cuda method against the fake driver and a forked CUDA
# target, the HTTP methods against a loopback server in the test
add_executable(test_suspender unit/test_suspender.c)
target_link_libraries(test_suspender osubd PkgConfig::CMOCKA PkgConfig::EVENT)
target_include_directories(test_suspender PRIVATE ${CMAKE_SOURCE_DIR}/tests/unit
                                                  ${CMAKE_SOURCE_DIR}/src/shim)
add_dependencies(test_suspender fake_cuda fake_cuda_nockpt)
add_test(NAME test_suspender COMMAND test_suspender $<TARGET_FILE:fake_cuda>
                                     $<TARGET_FILE:fake_cuda_nockpt>)
set_tests_properties(test_suspender PROPERTIES LABELS unit TIMEOUT 120)
