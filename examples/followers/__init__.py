"""Outside subscribers of the bus: plain NATS clients, no Atmosphere runtime."""
