"""advopenood's built-in plugins, registered through the same entry points a third party uses."""
