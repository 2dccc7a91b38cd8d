"""One HTTP/2 request over cleartext (prior knowledge) for the end-to-end
tests, which reqwest cannot send: the body as DATA frames that never end
the stream, then trailers that do.

stdin: {"port", "method", "path", "headers": [[k, v]], "body",
"trailers": [[k, v]]}; stdout: {"status", "headers", "body"}.
"""

import json
import socket
import sys
import time

import h2.config
import h2.connection
import h2.events


def main():
    req = json.load(sys.stdin)
    sock = socket.create_connection(("127.0.0.1", req["port"]), timeout=30)
    conn = h2.connection.H2Connection(
        config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    )
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    sid = conn.get_next_available_stream_id()
    head = [
        (":method", req["method"]),
        (":path", req["path"]),
        (":scheme", "http"),
        (":authority", "gateway"),
    ] + [tuple(h) for h in req["headers"]]
    body = req["body"].encode()
    conn.send_headers(sid, head, end_stream=False)
    sock.sendall(conn.data_to_send())
    # Two DATA frames, neither ending the stream, sent apart so Envoy sees
    # a body callback for each.
    half = len(body) // 2
    for chunk in (body[:half], body[half:]):
        conn.send_data(sid, chunk, end_stream=False)
        sock.sendall(conn.data_to_send())
        time.sleep(0.05)
    trailers = [tuple(t) for t in req["trailers"]]
    if trailers:
        conn.send_headers(sid, trailers, end_stream=True)
    else:
        conn.end_stream(sid)
    sock.sendall(conn.data_to_send())
    status, headers, out, done = 0, [], b"", False
    while not done:
        data = sock.recv(65536)
        if not data:
            break
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                headers = [[k, v] for k, v in ev.headers]
                status = int(dict(ev.headers)[":status"])
            elif isinstance(ev, h2.events.DataReceived):
                out += ev.data
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                done = True
        sock.sendall(conn.data_to_send())
    sock.close()
    json.dump({"status": status, "headers": headers, "body": out.decode("utf-8", "replace")}, sys.stdout)


if __name__ == "__main__":
    main()
