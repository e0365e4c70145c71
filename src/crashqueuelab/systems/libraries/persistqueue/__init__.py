"""persistqueue under the lab."""
