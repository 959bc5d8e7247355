"""Subcommands of the ``replication`` CLI; each module has ``add_arguments(parser)`` and ``run(args) -> int``."""
