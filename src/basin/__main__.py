"""``python -m basin``: the ``basin`` command, for environments without its script on PATH."""

from basin.cli.app import main

if __name__ == "__main__":
    main()
