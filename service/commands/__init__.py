"""The commands: the command line (``cli.py``) and what each command runs."""
