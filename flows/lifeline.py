"""What a command starts stops when the command is gone (launcher/lifeline.py), for the CLI's entry
point, which imports no launcher module itself: this module and launcher.lifeline import nothing else
of meshplan, so every command pays ~10 ms for it, not flows.server's process group and state folder."""

from launcher.lifeline import tie_children

__all__ = ["tie_children"]
