"""The REST endpoint clients call."""
