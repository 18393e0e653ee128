"""The simulated world: virtual clock and simulated cloud behind the same ports."""
