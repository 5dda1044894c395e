"""The ``basin`` command. Each sub-command lives in its own module and only
parses arguments, calls the library and prints; no logic of its own."""
