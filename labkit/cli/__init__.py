"""The `labkit` command (`labkit.cli.main`), its subcommands, the papermill runner and the worker processes."""
