"""The driver SDK and the simulated driver, as real processes and over in-process pipes."""
