"""The kubelet's side of a DRA driver: registration, DRAPlugin and DRAResourceHealth (docs/dra.md)."""
