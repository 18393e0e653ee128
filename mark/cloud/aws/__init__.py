"""The aws world: aiobotocore adapters (tested against a moto server on loopback)."""
