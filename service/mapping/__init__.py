"""Input mappings: where each field of the contract's events lives in a user's records."""
