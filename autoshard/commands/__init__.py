"""CLI commands, one module each; `autoshard.cli` discovers every module here."""
