"""One module per command. Each has `execute(options) -> exit code`, taking the typed options
of commands/options.py; the command line (cli.py) only parses into those and prints errors."""
