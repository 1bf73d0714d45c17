"""episerve client (placeholder until the client lands)."""
