"""A KV-cache event subscriber written the way vLLM's example is
(examples/features/kv_events/kv_events_subscriber.py: pyzmq SUB, a second socket for
replay, msgspec types decoded strictly), for tests/tests/kv_events.rs. The replay
socket is a DEALER sending [b"", start] (what a REQ sends): a REQ socket takes only the
first message of a reply that is several messages long.

    kv_events_subscriber.py collect PUB REPLAY TOPIC
        Connects, asks the replay socket for everything from sequence 0 (what was
        published before it connected), prints "ready", then reads until stdin closes
        (and 0.5 s more); fills every sequence gap through the replay socket. Prints one
        JSON object: {"seqs": [...], "replayed": [...], "events": [...]} where each
        event is {"seq", "type", ...fields}.
    kv_events_subscriber.py collect PUB REPLAY TOPIC SKIP
        The same, but discards every SKIP-th message read from the SUB socket, as if
        ZeroMQ had dropped it: the gap must be filled through the replay socket.
    kv_events_subscriber.py stall PUB TOPIC
        Subscribes, prints "ready" and never reads, until stdin closes.
    kv_events_subscriber.py replay REPLAY START
        Sends one replay request; prints {"seqs": [...], "error": text or null}.
"""

import json
import select
import sys
import time
from typing import Any

import msgspec
import zmq
from msgspec.msgpack import Decoder

# The wire types, as vLLM defines them (vllm/distributed/kv_events.py): the batch and
# each event array-like, the event tagged by its class name (inferd's default
# kv_events.event_encoding = "array"; with "map", drop array_like from KVCacheEvent).
ExternalBlockHash = bytes | int


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


END = (-1).to_bytes(8, "big", signed=True)
decoder = Decoder(type=KVEventBatch)


def as_json(seq: int, batch: KVEventBatch) -> list[dict]:
    out = []
    for e in batch.events:
        d = {"seq": seq, "type": type(e).__name__}
        for f in e.__struct_fields__:
            v = getattr(e, f)
            d[f] = [list(k) if k is not None else None for k in v] if f == "extra_keys" and v else v
        out.append(d)
    return out


def replay(sock: zmq.Socket, start: int, timeout_ms: int = 5000):
    """Returns ([(seq, payload)], error text or None)."""
    sock.send_multipart([b"", start.to_bytes(8, "big")])
    got, error = [], None
    while True:
        if not sock.poll(timeout_ms):
            raise SystemExit("replay: no reply")
        empty, seq_bytes, payload = sock.recv_multipart()
        assert empty == b"", empty
        if seq_bytes == END:
            if payload:
                error = payload.decode()
            return got, error
        got.append((int.from_bytes(seq_bytes, "big"), payload))


def collect(pub: str, replay_ep: str, topic: str, skip: int = 0) -> None:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(pub)
    sub.setsockopt_string(zmq.SUBSCRIBE, topic)
    req = ctx.socket(zmq.DEALER)
    req.connect(replay_ep)
    events, seqs, replayed = [], [], []
    last, read, skipped = -1, 0, []

    def take(seq: int, payload: bytes, via_replay: bool) -> None:
        nonlocal last
        if seq <= last:
            return
        if seq > last + 1:
            got, error = replay(req, last + 1)
            if error:
                raise SystemExit(f"replay refused: {error}")
            for s, p in got:
                if last < s < seq:
                    take(s, p, True)
        events.extend(as_json(seq, decoder.decode(payload)))
        seqs.append(seq)
        if via_replay:
            replayed.append(seq)
        last = seq

    # Give the subscription time to reach the publisher, then fetch what came before.
    time.sleep(0.3)
    for s, p in replay(req, 0)[0]:
        take(s, p, True)
    print("ready", flush=True)
    stdin_open, deadline = True, None
    while True:
        if sub.poll(50):
            topic_frame, seq_bytes, payload = sub.recv_multipart()
            assert topic_frame == topic.encode(), topic_frame
            read += 1
            if skip and read % skip == 0:
                skipped.append(int.from_bytes(seq_bytes, "big"))
            else:
                take(int.from_bytes(seq_bytes, "big"), payload, False)
        if stdin_open and select.select([sys.stdin], [], [], 0)[0]:
            if not sys.stdin.readline():
                stdin_open, deadline = False, time.monotonic() + 0.5
        if deadline is not None and time.monotonic() > deadline:
            break
    # A lost message with nothing after it shows no gap: catch up through replay.
    got, error = replay(req, last + 1)
    if error:
        raise SystemExit(f"replay refused: {error}")
    for s, p in got:
        take(s, p, True)
    print(json.dumps({"seqs": seqs, "replayed": replayed, "skipped": skipped, "events": events}))


def stall(pub: str, topic: str) -> None:
    sub = zmq.Context().socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 1)
    sub.connect(pub)
    sub.setsockopt_string(zmq.SUBSCRIBE, topic)
    time.sleep(0.3)
    print("ready", flush=True)
    sys.stdin.read()
    print(json.dumps({"stalled": True}))


def main() -> None:
    if sys.argv[1] == "collect":
        collect(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]) if len(sys.argv) > 5 else 0)
    elif sys.argv[1] == "stall":
        stall(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "replay":
        sock = zmq.Context().socket(zmq.DEALER)
        sock.connect(sys.argv[2])
        got, error = replay(sock, int(sys.argv[3]))
        for _, p in got:
            decoder.decode(p)
        print(json.dumps({"seqs": [s for s, _ in got], "error": error}))
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]}")


if __name__ == "__main__":
    main()
