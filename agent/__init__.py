"""skewd."""
