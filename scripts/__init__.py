"""Developer scripts: generate the stubs, lay out and measure the Go modules (README.md)."""
