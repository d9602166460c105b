import atmosphere.bus


def test_public_api_is_pinned() -> None:
    # A change here is a deliberate change of the bus's public API.
    assert sorted(atmosphere.bus.__all__) == [
        "BatchHandler",
        "BucketSpec",
        "Bus",
        "BusError",
        "ConnectError",
        "ConnectionLostError",
        "Consumer",
        "ConsumerSpec",
        "DecodeError",
        "Envelope",
        "Handler",
        "Headers",
        "JetStreamLayout",
        "MessageContext",
        "Nak",
        "NatsBus",
        "NoRespondersError",
        "NoStreamError",
        "PayloadTooLargeError",
        "PublishAck",
        "RemoteError",
        "RequestTimeoutError",
        "Retention",
        "Route",
        "Router",
        "ServiceError",
        "StreamSpec",
        "Subscription",
        "Term",
        "WorkHandler",
        "WorkItem",
        "connect",
        "reconnect_delay",
        "request_retrying",
        "runs",
        "subjects",
    ]
    for name in atmosphere.bus.__all__:
        assert getattr(atmosphere.bus, name) is not None


def test_reconnect_delay_backs_off_with_jitter_and_a_cap() -> None:
    for attempt in range(30):
        delay = atmosphere.bus.reconnect_delay(attempt, base=0.1, cap=5.0)
        ceiling = min(5.0, 0.1 * 2**attempt)
        assert ceiling / 2 <= delay <= ceiling
