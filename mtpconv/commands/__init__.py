"""One module per command: each orchestrates its job; none imports another."""
