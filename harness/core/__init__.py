"""The value types every stage shares: EngineConfig and ConfigError, Scenario, Trace and its
records, Verdict, the device records, and their one wire format. Imports nothing above it."""
