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
        "ConsumerState",
        "DecodeError",
        "Envelope",
        "Handler",
        "Headers",
        "JetStreamLayout",
        "LayoutNotProvisionedError",
        "MessageContext",
        "Nak",
        "NatsBus",
        "NoRespondersError",
        "NoStreamError",
        "ObjectBucketSpec",
        "PROVISIONED_BY",
        "PayloadTooLargeError",
        "PublishAck",
        "RemoteError",
        "Replication",
        "RequestTimeoutError",
        "RequiredLayout",
        "Retention",
        "Route",
        "Router",
        "ServiceError",
        "Storage",
        "StreamSpec",
        "StreamUnavailableError",
        "Subscription",
        "Term",
        "WorkHandler",
        "WorkItem",
        "WrongLastSequenceError",
        "connect",
        "reconnect_delay",
        "request_retrying",
        "run_queue",
        "runs",
        "sizes",
        "subjects",
        "text",
        "without_login",
    ]
    for name in atmosphere.bus.__all__:
        assert getattr(atmosphere.bus, name) is not None


def test_the_sizes_and_text_modules_are_pinned() -> None:
    # One owner for the sizes of bus messages and for text protobuf accepts: every service uses these.
    assert sorted(atmosphere.bus.sizes.__all__) == [
        "DEFAULT_MAX_PAYLOAD",
        "ENVELOPE_ROOM",
        "MAX_OBJECT_BYTES",
        "MIN_DATA_BYTES",
        "MIN_REPLY_BYTES",
        "REPLY_ROOM",
        "clip",
        "data_budget",
        "head",
        "reply_budget",
        "utf8_len",
    ]
    assert sorted(atmosphere.bus.text.__all__) == ["has_lone_surrogate", "replace_lone_surrogates"]
    for module in (atmosphere.bus.sizes, atmosphere.bus.text):
        for name in module.__all__:
            assert getattr(module, name) is not None


def test_reconnect_delay_backs_off_with_jitter_and_a_cap() -> None:
    for attempt in range(30):
        delay = atmosphere.bus.reconnect_delay(attempt, base=0.1, cap=5.0)
        ceiling = min(5.0, 0.1 * 2**attempt)
        assert ceiling / 2 <= delay <= ceiling
