"""memgate on many machines (SPEC §6): partition ownership through leases in NATS KV."""
