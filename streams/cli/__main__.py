"""``python -m streams.cli``: the same as ``vigil``."""

from streams.cli.main import main

main()
