"""`python -m cli ARGS`: the `meshplan` console script without installing it (tests, bench, CI)."""

from cli.main import main

main()
