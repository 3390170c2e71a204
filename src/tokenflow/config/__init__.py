"""Typed configuration: sections, TOML loading, dotted command-line overrides."""
