"""The `autoshard` command line: the entry point (`main`), arguments shared by several commands
(`args`), and one module per command, each defining `register(subparsers)`.

May import: anything in `autoshard`. Commands of other installed packages (the service's
`serve`) are found through the `autoshard.commands` entry points, so nothing here imports them.
"""
