#!/usr/bin/python3
"""kubelet_standin.py - the kubelet's side of the device-plugin API (v1beta1), for
tests/integration/test_deviceplugin.sh: no cluster needed.

  serve DIR            the Registration service on DIR/kubelet.sock (as a starting kubelet
                       does, first removes the other sockets in DIR); prints one line a Register
  watch DIR [N]        ListAndWatch on DIR/oversub.sock: one line per list it streams (N: end after N)
  stuck-watch DIR N    N ListAndWatch streams that never read (window 0), held until killed
  options DIR          GetDevicePluginOptions
  prestart DIR [PREFIX N [SECONDS]]
                       PreStartContainer for the IDs PREFIX0 .. PREFIX<N-1> (default: one ID,
                       "a"), waiting up to SECONDS (10; the kubelet's is 30): "prestart ok", or
                       "prestart CODE message"
  preferred DIR SIZE ID... GetPreferredAllocation from the IDs given
  preferred-many DIR N   GetPreferredAllocation of N IDs (half must-include): checks the answer
  allocate DIR [--prefix P] N...
                       Allocate, one container per N (that many device IDs, named P0, P1, ...
                       across the request; P is "d" by default): a JSON line
  raw DIR METHOD HEX   a unary call with the bytes given as the request: the status

Debian's python3-grpcio and python3-grpc-tools (the .proto is compiled at start, into a
temporary folder). Lines are flushed as they are printed: the test waits for them.
"""
import json
import os
import signal
import sys
import tempfile
import threading
from concurrent import futures

import grpc
from grpc_tools import protoc

HERE = os.path.dirname(os.path.abspath(__file__))


def load_proto():
    out = tempfile.mkdtemp(prefix="dpproto.")
    rc = protoc.main(["protoc", "-I" + HERE, "--python_out=" + out, "--grpc_python_out=" + out,
                      os.path.join(HERE, "deviceplugin.proto")])
    if rc != 0:
        sys.exit("kubelet_standin: protoc failed on deviceplugin.proto")
    sys.path.insert(0, out)
    import deviceplugin_pb2 as pb
    import deviceplugin_pb2_grpc as pbg
    return pb, pbg


pb, pbg = load_proto()


def say(*a):
    print(*a, flush=True)


def channel(d):
    return grpc.insecure_channel("unix://" + os.path.join(d, "oversub.sock"))


def serve(d):
    for name in os.listdir(d):  # a starting kubelet removes what plugins left
        p = os.path.join(d, name)
        if name != "kubelet.sock" and not os.path.isdir(p):
            os.unlink(p)
    sock = os.path.join(d, "kubelet.sock")
    if os.path.exists(sock):
        os.unlink(sock)

    class Reg(pbg.RegistrationServicer):
        def Register(self, req, ctx):
            say("register version=%s endpoint=%s resource=%s pre_start=%d" %
                (req.version, req.endpoint, req.resource_name, req.options.pre_start_required))
            return pb.Empty()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pbg.add_RegistrationServicer_to_server(Reg(), server)
    server.add_insecure_port("unix://" + sock)
    server.start()
    say("serving %s" % sock)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    server.stop(0)


def watch(d, lists=0):
    """Prints a line per list streamed; with lists > 0, ends after that many (a kubelet that
    read what it needed), else when the stream ends."""
    stub = pbg.DevicePluginStub(channel(d))
    seen = 0
    try:
        for resp in stub.ListAndWatch(pb.Empty()):
            ids = [x.ID for x in resp.devices]
            healthy = sum(1 for x in resp.devices if x.health == "Healthy")
            say("devices %d healthy=%d unique=%d maxlen=%d bytes=%d" %
                (len(ids), healthy, len(set(ids)), max((len(i) for i in ids), default=0),
                 resp.ByteSize()))
            seen += 1
            if lists > 0 and seen >= lists:
                return
    except grpc.RpcError as e:
        say("watch ended %s" % e.code().name)


def stuck_watch(d, n):
    """n ListAndWatch streams on one raw HTTP/2 connection that never reads: its stream window
    is 0, so the plugin can send nothing (a kubelet stuck). Prints "stuck N" once the streams
    are open, then holds them until killed. HPACK by hand: literal headers, no Huffman."""
    import socket, struct
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.path.join(d, "oversub.sock"))
    def frame(kind, flags, sid, payload):
        return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", sid) + payload
    def lit(name, value):
        return bytes([0x00, len(name)]) + name + bytes([len(value)]) + value
    out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, struct.pack(">HI", 4, 0))
    hdrs = (lit(b":method", b"POST") + lit(b":scheme", b"http") +
            lit(b":path", b"/v1beta1.DevicePlugin/ListAndWatch") + lit(b":authority", b"localhost") +
            lit(b"content-type", b"application/grpc") + lit(b"te", b"trailers"))
    for i in range(n):
        sid = 2 * i + 1
        out += frame(1, 0x4, sid, hdrs) + frame(0, 0x1, sid, b"\x00\x00\x00\x00\x00")
    s.sendall(out)
    say("stuck %d" % n)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    # control frames are read and answered (SETTINGS acked, PING echoed); no WINDOW_UPDATE is
    # ever sent, so no list can come
    buf = b""
    while True:
        b = s.recv(65536)
        if not b:
            say("stuck: the plugin closed the connection")
            return
        buf += b
        while len(buf) >= 9:
            ln = int.from_bytes(buf[0:3], "big")
            if len(buf) < 9 + ln:
                break
            kind, flags, payload = buf[3], buf[4], buf[9:9 + ln]
            buf = buf[9 + ln:]
            if kind == 4 and not flags & 1:
                s.sendall(frame(4, 0x1, 0, b""))
            elif kind == 6 and not flags & 1:
                s.sendall(frame(6, 0x1, 0, payload))
            elif kind == 7:
                say("stuck: GOAWAY %s" % payload[4:8].hex())


def status_line(e):
    return json.dumps({"ok": False, "code": e.code().name, "message": e.details()})


def main():
    cmd, d = sys.argv[1], sys.argv[2]
    if cmd == "serve":
        serve(d)
    elif cmd == "watch":
        watch(d, int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    elif cmd == "stuck-watch":
        stuck_watch(d, int(sys.argv[3]))
    elif cmd == "options":
        o = pbg.DevicePluginStub(channel(d)).GetDevicePluginOptions(pb.Empty(), timeout=10)
        say("options pre_start=%d preferred=%d" %
            (o.pre_start_required, o.get_preferred_allocation_available))
    elif cmd == "prestart":
        ids = ["a"]
        wait = 10.0
        if len(sys.argv) > 4:
            ids = ["%s%d" % (sys.argv[3], i) for i in range(int(sys.argv[4]))]
        if len(sys.argv) > 5:
            wait = float(sys.argv[5])
        try:
            pbg.DevicePluginStub(channel(d)).PreStartContainer(
                pb.PreStartContainerRequest(devices_ids=ids), timeout=wait)
            say("prestart ok")
        except grpc.RpcError as e:
            say("prestart %s %s" % (e.code().name, e.details()))
    elif cmd == "preferred":
        size, ids = int(sys.argv[3]), sys.argv[4:]
        r = pbg.DevicePluginStub(channel(d)).GetPreferredAllocation(
            pb.PreferredAllocationRequest(container_requests=[
                pb.ContainerPreferredAllocationRequest(available_deviceIDs=ids,
                                                       must_include_deviceIDs=ids[-1:],
                                                       allocation_size=size)]), timeout=10)
        say("preferred " + ",".join(r.container_responses[0].deviceIDs))
    elif cmd == "preferred-many":
        # N IDs available, the second half of them also must-include, size N: the answer is
        # every ID once, the musts first (issue 23: quadratic on the daemon's loop)
        n = int(sys.argv[3])
        ids = ["dev-%06d" % i for i in range(n)]
        try:
            r = pbg.DevicePluginStub(channel(d)).GetPreferredAllocation(
                pb.PreferredAllocationRequest(container_requests=[
                    pb.ContainerPreferredAllocationRequest(available_deviceIDs=ids,
                                                           must_include_deviceIDs=ids[n // 2:],
                                                           allocation_size=n)]), timeout=120)
            got = list(r.container_responses[0].deviceIDs)
            say("preferred-many n=%d unique=%d musts_first=%s" %
                (len(got), len(set(got)), got[:n - n // 2] == ids[n // 2:]))
        except grpc.RpcError as e:
            say("preferred-many %s %s" % (e.code().name, e.details()))
    elif cmd == "allocate":
        req = pb.AllocateRequest()
        n0 = 0
        args, prefix = sys.argv[3:], "d"
        if args[:1] == ["--prefix"]:
            prefix, args = args[1], args[2:]
        for n in map(int, args):
            req.container_requests.add(devices_ids=["%s%d" % (prefix, i) for i in range(n0, n0 + n)])
            n0 += n
        try:
            r = pbg.DevicePluginStub(channel(d)).Allocate(req, timeout=10)
        except grpc.RpcError as e:
            say(status_line(e))
            return
        say(json.dumps({"ok": True, "containers": [
            {"envs": dict(c.envs),
             "mounts": [{"container_path": m.container_path, "host_path": m.host_path,
                         "read_only": m.read_only} for m in c.mounts]}
            for c in r.container_responses]}))
    elif cmd == "raw":
        call = channel(d).unary_unary("/v1beta1.DevicePlugin/" + sys.argv[3],
                                      request_serializer=None, response_deserializer=None)
        try:
            call(bytes.fromhex(sys.argv[4]), timeout=10)
            say("raw OK")
        except grpc.RpcError as e:
            say("raw %s %s" % (e.code().name, e.details()))
    else:
        sys.exit("kubelet_standin: unknown command " + cmd)


if __name__ == "__main__":
    main()
