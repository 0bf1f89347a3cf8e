"""Run configuration: the YAML schema, loading and validation, protocols and the resolved run plan."""
