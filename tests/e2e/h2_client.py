"""One HTTP/2 request over cleartext (prior knowledge) for the end-to-end
tests, which reqwest cannot send: the body as DATA frames that never end
the stream, then trailers that do (or a reset that abandons it).

stdin: {"port", "method", "path", "headers": [[k, v]], "body",
"trailers": [[k, v]], and optionally "wait_100" (send the body only after
a 1xx), "reset_after_half" (send half the body, then RST_STREAM(CANCEL)),
"raw_names" (send header names as given: h2 refuses uppercase names
otherwise)}; stdout: {"status", "headers", "body", "informational" (the 1xx
statuses), "reset" (the server's RST_STREAM code, or null), "goaway" (its
GOAWAY code, or null), "closed" (it closed the connection first), "head_frames"
(the frame types that carried the request's header block: 1 HEADERS, 9
CONTINUATION)}.
"""

import json
import socket
import sys
import time

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions


def frame_types(data):
    """The types of the HTTP/2 frames in `data` (whole frames only)."""
    types = []
    while len(data) >= 9:
        length = int.from_bytes(data[0:3], "big")
        types.append(data[3])
        data = data[9 + length :]
    return types


def connect(req):
    """The connection and its socket, the client preface sent."""
    sock = socket.create_connection(("127.0.0.1", req["port"]), timeout=30)
    raw_names = req.get("raw_names", False)
    conn = h2.connection.H2Connection(
        config=h2.config.H2Configuration(
            client_side=True,
            header_encoding="utf-8",
            validate_outbound_headers=not raw_names,
            normalize_outbound_headers=not raw_names,
        )
    )
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    return conn, sock


class Exchange:
    """One stream's answer as it arrives."""

    def __init__(self, conn, sock):
        self.conn, self.sock = conn, sock
        self.status, self.headers, self.out, self.done = 0, [], b"", False
        self.informational, self.reset, self.goaway, self.closed = [], None, None, False

    def handle(self, events):
        for ev in events:
            if isinstance(ev, h2.events.InformationalResponseReceived):
                self.informational.append(int(dict(ev.headers)[":status"]))
            elif isinstance(ev, h2.events.ResponseReceived):
                self.headers = [[k, v] for k, v in ev.headers]
                self.status = int(dict(ev.headers)[":status"])
            elif isinstance(ev, h2.events.DataReceived):
                self.out += ev.data
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamReset):
                self.reset = int(ev.error_code)
                self.done = True
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self.goaway = int(ev.error_code)
                self.done = True
            elif isinstance(ev, h2.events.StreamEnded):
                self.done = True
        try:
            self.sock.sendall(self.conn.data_to_send())
        except OSError:
            pass  # Envoy closed the connection

    def read_once(self):
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            self.closed = True
            return False
        self.handle(self.conn.receive_data(data))
        return True

    def wait_for_interim(self):
        """As a client that honours `expect: 100-continue` does: the body
        waits for the interim answer (or any final one)."""
        deadline = time.time() + 10
        while not self.informational and not self.done and time.time() < deadline:
            if not self.read_once():
                break

    def send_body(self, sid, body, trailers):
        """Two DATA frames, neither ending the stream, sent apart so Envoy
        sees a body callback for each; then the trailers or an empty end."""
        half = len(body) // 2
        try:
            if not self.done:
                for chunk in (body[:half], body[half:]):
                    self.conn.send_data(sid, chunk, end_stream=False)
                    self.sock.sendall(self.conn.data_to_send())
                    time.sleep(0.05)
                if trailers:
                    self.conn.send_headers(sid, trailers, end_stream=True)
                else:
                    self.conn.end_stream(sid)
                self.sock.sendall(self.conn.data_to_send())
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError, OSError):
            pass  # answered, reset or closed before the body was all sent

    def reset_after_half(self, sid, body):
        """Half the body, then the stream reset (a client that gives up)."""
        self.conn.send_data(sid, body[: len(body) // 2], end_stream=False)
        self.sock.sendall(self.conn.data_to_send())
        time.sleep(0.2)
        self.conn.reset_stream(sid, error_code=h2.errors.ErrorCodes.CANCEL)
        self.sock.sendall(self.conn.data_to_send())
        time.sleep(0.3)
        self.sock.close()


def main():
    req = json.load(sys.stdin)
    conn, sock = connect(req)
    sid = conn.get_next_available_stream_id()
    head = [
        (":method", req["method"]),
        (":path", req["path"]),
        (":scheme", "http"),
        (":authority", "gateway"),
    ] + [tuple(h) for h in req["headers"]]
    body = req["body"].encode()
    conn.send_headers(sid, head, end_stream=False)
    sent = conn.data_to_send()
    head_frames = frame_types(sent)
    sock.sendall(sent)
    ex = Exchange(conn, sock)
    if req.get("wait_100"):
        ex.wait_for_interim()
    if req.get("reset_after_half"):
        ex.reset_after_half(sid, body)
        json.dump(
            {"status": 0, "headers": [], "body": "", "informational": ex.informational,
             "reset": None, "head_frames": head_frames},
            sys.stdout,
        )
        return
    ex.send_body(sid, body, [tuple(t) for t in req["trailers"]])
    while not ex.done:
        if not ex.read_once():
            break
    sock.close()
    json.dump(
        {"status": ex.status, "headers": ex.headers, "body": ex.out.decode("utf-8", "replace"),
         "informational": ex.informational, "reset": ex.reset, "goaway": ex.goaway,
         "closed": ex.closed, "head_frames": head_frames},
        sys.stdout,
    )


if __name__ == "__main__":
    main()
