"""What every run shares: its record and directory, interrupts, progress lines, the servers
it starts, the command lines its page prints, and the one registry of run kinds."""
