"""The lab: which devices a host has (discovery or an inventory file), who holds them
(leases, broken-device records), which tests are known to fail (quarantine) and which
slice of the run a host takes (shard)."""
