"""What runs inside an engine process: its request loop, probes of the KV ledgers, teacher forcing, faults."""
