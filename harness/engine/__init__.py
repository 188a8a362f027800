"""The harness side of an engine: its process host, the fork server, the pool of live engines, the driver, hygiene and test order."""
